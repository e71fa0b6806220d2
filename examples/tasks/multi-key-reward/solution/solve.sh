#!/bin/bash
# Reference solution: header, then n,n*n for n = 1..10 (cwd is the workdir, /app).
set -euo pipefail
{
  echo "n,square"
  for n in $(seq 1 10); do echo "$n,$((n * n))"; done
} > squares.csv
