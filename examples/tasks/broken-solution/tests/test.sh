#!/bin/bash
# Verifier (runs as root, cwd = workdir /app). Writes one float to
# /logs/verifier/reward.txt: 1 when answer.txt holds 5050, else 0.
# No `set -e`: the reward must be written whatever happens.
set -u
mkdir -p /logs/verifier
# Strip whitespace so "5050", "5050\n" and " 5050 " all count.
if [ -f answer.txt ] && [ "$(tr -d '[:space:]' < answer.txt)" = 5050 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
cat /logs/verifier/reward.txt
