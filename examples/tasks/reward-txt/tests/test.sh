#!/bin/bash
# Verifier (runs as root, cwd = workdir /app). Writes one float to
# /logs/verifier/reward.txt: 1 when words.txt is exactly right, else 0.
# No `set -e`: the reward must be written whatever happens.
set -u
mkdir -p /logs/verifier
expected=$(printf '%s\n' AND BROWN CAT DOG FOX JUMPS LAZY OVER QUICK THE)
# $(...) drops trailing newlines, so a missing final newline is tolerated.
if [ -f words.txt ] && [ "$(cat words.txt)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
cat /logs/verifier/reward.txt
