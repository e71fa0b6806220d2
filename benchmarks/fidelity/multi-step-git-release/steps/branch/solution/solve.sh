#!/bin/bash
set -euo pipefail
cd /work/calc
git checkout -qb feature/subtract
printf '\n\ndef subtract(a, b):\n    return a - b\n' >> calc.py
git commit -qam "Add subtract"
git checkout -q main
git merge -q --no-edit feature/subtract
git log --oneline --graph
