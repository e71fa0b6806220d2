#!/bin/bash
set -euo pipefail
cd /work/calc
git init -q
git add calc.py
git commit -qm "Initial import"
git log --oneline
