#!/bin/bash
cd /app

score=1
if [ ! -f sales.db ]; then
  echo "sales.db is missing"; score=0
else
  n=$(sqlite3 sales.db "SELECT COUNT(*) FROM orders;" 2>/dev/null)
  [ "$n" = "8" ] || { echo "orders table has '$n' rows, want 8"; score=0; }
  m=$(sqlite3 sales.db "SELECT COUNT(*) FROM regions;" 2>/dev/null)
  [ "$m" = "4" ] || { echo "regions table has '$m' rows, want 4"; score=0; }
fi

expected=$'region,orders,total\nEast,2,2500.01\nSouth,3,650.00\nNorth,3,173.83'
actual=$(tr -d '\r' < report.csv 2>/dev/null)
if [ "$actual" != "$expected" ]; then
  echo "report.csv differs:"; echo "$actual"; score=0
fi

echo $score > /logs/verifier/reward.txt
