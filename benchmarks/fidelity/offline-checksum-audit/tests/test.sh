#!/bin/bash
reward=1
[ "$(cat /srv/audit.txt 2>/dev/null)" = $'config.json MISMATCH\nlib.so MISMATCH\nmanual.pdf MISSING' ] || { echo "audit.txt:"; cat /srv/audit.txt; reward=0; }
# This task is meant to run without a network.
if [ -n "$(awk 'NR > 2 && $1 != "lo:" {print $1}' /proc/net/dev)" ]; then
  echo "the environment has a network interface"; reward=0
fi
echo $reward > /logs/verifier/reward.txt
