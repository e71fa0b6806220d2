#!/bin/bash
# Terminal-Bench 2.0 verifiers fetch uv from its web installer; this one installs pytest from PyPI.
pip install --quiet --no-cache-dir pytest==8.3.4

cd /app
pytest -rA /tests/test_outputs.py -p no:cacheprovider
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
