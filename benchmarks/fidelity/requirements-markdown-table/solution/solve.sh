#!/bin/bash
set -euo pipefail
cat > /app/report.py <<'PY'
import json

from tabulate import tabulate

with open("/app/benchmarks.json") as f:
    results = sorted(json.load(f), key=lambda r: r["mean_ms"])

rows = [(r["name"], r["runs"], f"{r['mean_ms']:.1f}") for r in results]
table = tabulate(rows, headers=["Benchmark", "Runs", "Mean (ms)"], tablefmt="github", disable_numparse=True)
with open("/app/REPORT.md", "w") as f:
    f.write(table + "\n")
print(table)
PY
python /app/report.py
