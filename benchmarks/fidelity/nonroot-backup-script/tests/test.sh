#!/bin/bash
reward=1
home=/home/dev
archive="$home/backups/notes-$(date -u +%Y%m%d).tar.gz"

[ -x "$home/project/backup.sh" ] || { echo "backup.sh missing or not executable"; reward=0; }
if [ -f "$archive" ]; then
  listing=$(tar -tzf "$archive" | sort)
  [ "$listing" = $'notes/ideas.md\nnotes/standup.md' ] || { echo "archive holds: $listing"; reward=0; }
  [ "$(stat -c %U "$archive")" = "dev" ] || { echo "archive is not owned by dev"; reward=0; }
  [ "$(stat -c %U "$home/backups")" = "dev" ] || { echo "~/backups is not owned by dev"; reward=0; }
else
  echo "no $archive"; reward=0
fi
echo $reward > /logs/verifier/reward.txt
