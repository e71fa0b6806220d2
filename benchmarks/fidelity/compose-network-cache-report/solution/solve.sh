#!/bin/bash
set -euo pipefail
cli() { redis-cli -h "$CACHE_HOST" -p "$CACHE_PORT" "$@"; }
: > /tmp/views.txt
for key in $(cli --scan --pattern 'views:*'); do
  [ "$key" = views:total ] && continue
  echo "${key#views:} $(cli GET "$key")" >> /tmp/views.txt
done
sort -k2,2nr /tmp/views.txt | head -n 3 > /app/report.txt
echo "Prepared by $REPORT_OWNER" >> /app/report.txt
cli SET views:total "$(awk '{ total += $2 } END { print total }' /tmp/views.txt)" > /dev/null
