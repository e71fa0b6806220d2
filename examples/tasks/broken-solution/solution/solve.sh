#!/bin/bash
# DELIBERATELY WRONG reference solution (negative control): the right answer
# is 5050, this writes 5000, so an oracle run must score reward 0.0. It lets
# the pipeline prove that a failing solution is reported as a 0, not an error.
set -euo pipefail
echo 5000 > answer.txt
