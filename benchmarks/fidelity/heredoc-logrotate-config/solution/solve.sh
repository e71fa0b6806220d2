#!/bin/bash
set -euo pipefail
days=$(awk -F= '/^max_age_days/ {gsub(/ /, "", $2); print $2}' /etc/app/retention.conf)
cd /var/log/app
find . -maxdepth 1 -type f -mtime +"$((days - 1))" -delete
newest=$(ls -t -- *.log | head -n 1)
for f in *.log; do
  [ "$f" = "$newest" ] || gzip -f "$f"
done
ls -l
