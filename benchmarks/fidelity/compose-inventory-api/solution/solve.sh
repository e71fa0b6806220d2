#!/bin/bash
set -euo pipefail
API=http://inventory:8000
: > /app/restocked.txt
for id in $(curl -fsS "$API/items" | jq -r '.[]'); do
  stock=$(curl -fsS "$API/items/$id" | jq -r '.stock')
  if [ "$stock" -lt 5 ]; then
    curl -fsS -X POST -H 'Content-Type: application/json' \
      -d "{\"id\": \"$id\", \"quantity\": $((10 - stock))}" "$API/restock" >/dev/null
    echo "$id" >> /app/restocked.txt
  fi
done
sort -o /app/restocked.txt /app/restocked.txt
cat /app/restocked.txt
