#!/bin/bash
reward=1
expected=$'home 1840\ndocs 1377\npricing 612\nPrepared by analytics-team'
if [ "$(cat /app/report.txt 2>/dev/null)" != "$expected" ]; then
  echo "report.txt is wrong:"; cat /app/report.txt; reward=0
fi
total=$(redis-cli -h kv -p "${CACHE_PORT:-6379}" GET views:total)
[ "$total" = 4563 ] || { echo "views:total is '$total', want 4563"; reward=0; }
echo $reward > /logs/verifier/reward.txt
