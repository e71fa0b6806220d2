#!/bin/sh
# Log files of various ages, relative to the time the image is built.
set -e
cd /var/log/app
for age in 1 2 3 30 60 90; do
  f="app-$(printf '%02d' "$age")d.log"
  printf 'log line from %s days ago\n' "$age" > "$f"
  touch -d "-${age} days" "$f"
done
printf 'current\n' > app.log
printf 'keep me\n' > /var/log/unrelated.log
touch -d "-40 days" /var/log/unrelated.log
