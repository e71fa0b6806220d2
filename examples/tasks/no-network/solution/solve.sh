#!/bin/bash
# Reference solution: /proc/net/dev has two header lines, then "name: counters...".
set -euo pipefail
awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' /proc/net/dev | LC_ALL=C sort > interfaces.txt
