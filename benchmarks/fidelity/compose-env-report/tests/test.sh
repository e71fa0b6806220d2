#!/bin/bash
expected=$'env=staging\nregion=eu-west-3\nmetrics=10.20.30.40'
if [ "$(cat /srv/app/report.txt 2>/dev/null)" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo "report.txt:"; cat /srv/app/report.txt 2>/dev/null
  echo 0 > /logs/verifier/reward.txt
fi
