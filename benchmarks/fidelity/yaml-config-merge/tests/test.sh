#!/bin/bash
cd /app

python3 - <<'PY'
import json
import subprocess
import sys

expected = {
    "service": {"name": "ledger", "port": 8000, "workers": 8},
    "database": {"host": "db.internal", "port": 5432, "options": {"sslmode": "require", "connect_timeout": 5}},
    "features": ["audit"],
}

ok = True
try:
    saved = json.load(open("/app/merged.json"))
except Exception as e:
    print(f"merged.json unreadable: {e}")
    ok = False
else:
    if saved != expected:
        print("merged.json is wrong:", saved)
        ok = False

run = subprocess.run([sys.executable, "/app/merge_config.py"], capture_output=True, text=True)
try:
    if json.loads(run.stdout) != expected:
        print("merge_config.py prints something else:", run.stdout)
        ok = False
except ValueError:
    print("merge_config.py did not print JSON:", run.stdout, run.stderr)
    ok = False

open("/logs/verifier/reward.txt", "w").write("1" if ok else "0")
print("PASS" if ok else "FAIL")
PY
