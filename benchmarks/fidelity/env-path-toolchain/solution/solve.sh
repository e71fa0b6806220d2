#!/bin/bash
set -uo pipefail
cd /app
: > invalid.txt
for f in manifests/*.conf; do
  shipit validate "$f" || basename "$f" >> invalid.txt
done
sort -o invalid.txt invalid.txt
cat invalid.txt
