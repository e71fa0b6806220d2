#!/bin/bash
set -euo pipefail
sqlite3 -separator ': ' /var/lib/tracker/tracker.db \
  "SELECT assignee, COUNT(*) FROM tickets WHERE status = 'open' GROUP BY assignee ORDER BY assignee;" \
  > ~/open_by_assignee.txt
cat ~/open_by_assignee.txt
