#!/bin/bash
set -uo pipefail
cd /srv/release
sha256sum -c SHA256SUMS 2>/dev/null \
  | awk -F': ' '$2 == "FAILED" {print $1 " MISMATCH"} $2 == "FAILED open or read" {print $1 " MISSING"}' \
  | sort > /srv/audit.txt
cat /srv/audit.txt
