#!/bin/bash
API=http://inventory:8000
reward=1

if [ "$(cat /app/restocked.txt 2>/dev/null)" != $'A101\nB200\nC300' ]; then
  echo "restocked.txt is wrong"; reward=0
fi
for id in A101 B200 C300; do
  stock=$(curl -fsS "$API/items/$id" | jq -r '.stock')
  [ "$stock" = "10" ] || { echo "$id has stock $stock, want 10"; reward=0; }
done
for id in A100 B201; do
  stock=$(curl -fsS "$API/items/$id" | jq -r '.stock')
  [ "$stock" != "10" ] || { echo "$id should not have been restocked"; reward=0; }
done
echo $reward > /logs/verifier/reward.txt
