#!/bin/bash
# The image has no test tools: install pytest for the verifier only.
pip install --quiet --no-cache-dir pytest==8.3.4

cd /app
pytest -q /tests/test_roman.py -p no:cacheprovider
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
