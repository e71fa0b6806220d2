#ifndef COUNT_H
#define COUNT_H

#include <stdio.h>

struct counts {
    long lines;
    long words;
    long bytes;
};

struct counts count_stream(FILE *in);

#endif
