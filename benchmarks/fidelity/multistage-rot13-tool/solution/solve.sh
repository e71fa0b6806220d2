#!/bin/bash
set -euo pipefail
rot13 < /app/note.enc > /app/note.txt
cat /app/note.txt
