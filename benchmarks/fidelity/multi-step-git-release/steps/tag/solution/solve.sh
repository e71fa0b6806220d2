#!/bin/bash
set -euo pipefail
cd /work/calc
git tag -a v1.0.0 -m "First release" main
git show --no-patch v1.0.0
