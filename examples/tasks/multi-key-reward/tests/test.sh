#!/bin/bash
# Verifier (runs as root, cwd = workdir /app). Writes /logs/verifier/reward.json
# with three keys, each computed from squares.csv:
#   format      1.0 if the header is exactly "n,square" and every data row is "<int>,<int>"
#   correctness 1.0 if the data rows are exactly "n,n*n" for n = 1..10, in order
#   reward      1.0 only when both hold
# No `set -e`: a failed check must lower a score, never skip writing the reward.
set -u
mkdir -p /logs/verifier
f=squares.csv
format=0.0
correctness=0.0
if [ -f "$f" ]; then
  # awk instead of grep pipelines: no SIGPIPE/pipefail surprises, one pass.
  if awk 'NR == 1 { ok = ($0 == "n,square") }
          NR > 1 && !/^[0-9]+,[0-9]+$/ { ok = 0 }
          END { exit !(ok && NR > 1) }' "$f"; then
    format=1.0
  fi
  expected=$(for n in $(seq 1 10); do echo "$n,$((n * n))"; done)
  if [ "$(tail -n +2 "$f")" = "$expected" ]; then
    correctness=1.0
  fi
fi
reward=0.0
if [ "$format" = 1.0 ] && [ "$correctness" = 1.0 ]; then reward=1.0; fi
printf '{"reward": %s, "correctness": %s, "format": %s}\n' \
  "$reward" "$correctness" "$format" > /logs/verifier/reward.json
cat /logs/verifier/reward.json
