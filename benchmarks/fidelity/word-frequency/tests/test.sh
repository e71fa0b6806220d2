#!/bin/bash
# Compares /app/top5.txt with the expected counts for the shipped corpus.

expected="$(cat <<'OUT'
19 the
5 boat
4 and
3 harbor
3 in
OUT
)"

if [ -f /app/top5.txt ] && [ "$(cat /app/top5.txt)" = "$expected" ]; then
  echo "PASS"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: got"
  cat /app/top5.txt 2>/dev/null || echo "(no /app/top5.txt)"
  echo 0 > /logs/verifier/reward.txt
fi
