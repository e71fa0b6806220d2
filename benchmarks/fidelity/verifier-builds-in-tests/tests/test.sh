#!/bin/bash
# The verifier writes into /tests itself (a generated module, pytest's cache), as Harbor's upload allows.
cd /tests
python3 generate.py
python3 -m pytest -q test_sum.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
