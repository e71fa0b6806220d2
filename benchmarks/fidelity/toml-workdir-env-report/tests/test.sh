#!/bin/bash
f=/workspace/service.ini
if [ "$(pwd)" = "/workspace" ] \
   && grep -qx '\[service\]' "$f" \
   && grep -Eqx "owner ?= ?${EXPECTED_OWNER}" "$f" \
   && grep -Eqx 'tier ?= ?gold' "$f"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "cwd $(pwd); service.ini:"; cat "$f" 2>/dev/null
  echo 0 > /logs/verifier/reward.txt
fi
