#!/bin/bash
# Reference solution: split on spaces, uppercase, sort with duplicates removed.
set -euo pipefail
echo "the quick brown fox jumps over the lazy dog and the cat" \
  | tr ' ' '\n' | tr '[:lower:]' '[:upper:]' | LC_ALL=C sort -u > words.txt
