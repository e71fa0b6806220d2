#!/bin/bash
cd /work/calc 2>/dev/null || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if [ "$(git log -1 --format=%s main 2>/dev/null)" = "Initial import" ] \
   && git ls-files --error-unmatch calc.py >/dev/null 2>&1; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
