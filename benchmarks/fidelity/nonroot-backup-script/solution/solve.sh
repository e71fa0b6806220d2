#!/bin/bash
set -euo pipefail
cd ~/project

cat > backup.sh <<'SH'
#!/bin/bash
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$HOME/backups"
archive="$HOME/backups/notes-$(date -u +%Y%m%d).tar.gz"
cd "$here"
find notes -type f -name '*.md' -print0 | sort -z | tar --null -czf "$archive" -T -
echo "$archive"
SH
chmod +x backup.sh
./backup.sh
