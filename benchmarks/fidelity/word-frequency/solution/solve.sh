#!/bin/bash
set -euo pipefail

cd /app
tr -cs 'A-Za-z' '\n' < corpus.txt \
  | tr 'A-Z' 'a-z' \
  | grep -v '^$' \
  | sort \
  | uniq -c \
  | awk '{print $1, $2}' \
  | sort -k1,1nr -k2,2 \
  | head -n 5 > top5.txt
cat top5.txt
