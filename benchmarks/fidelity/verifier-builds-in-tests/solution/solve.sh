#!/bin/bash
set -euo pipefail
python3 -c "print(sum(int(line) for line in open('/app/numbers.txt')))" > /app/sum.txt
