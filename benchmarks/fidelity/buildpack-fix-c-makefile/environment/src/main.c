#include "count.h"

int main(void) {
    struct counts c = count_stream(stdin);
    printf("%ld %ld %ld\n", c.lines, c.words, c.bytes)
    return 0;
}
