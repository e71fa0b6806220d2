#!/bin/bash
# The database is created at container start (as in production), not baked into the image.
set -euo pipefail
db=/var/lib/tracker/tracker.db
if [ ! -f "$db" ]; then
  sqlite3 "$db" < /opt/tracker/seed.sql
fi
exec "$@"
