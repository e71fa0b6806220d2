#!/bin/bash
expected=$'aiko: 1\njonas: 1\nmira: 3'
out=/home/analyst/open_by_assignee.txt
if [ "$(cat "$out" 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "got:"; cat "$out" 2>/dev/null
  echo 0 > /logs/verifier/reward.txt
fi
