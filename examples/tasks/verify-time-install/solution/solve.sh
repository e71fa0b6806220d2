#!/bin/bash
# Reference solution (cwd is the workdir, /app).
set -euo pipefail
printf '{"name": "prefect-harbor", "version": 1}\n' > release.json
