#!/bin/bash
set -euo pipefail

python3 - <<'PY'
import csv
import json

report = {}
with open("/app/stock.csv", newline="") as handle:
    for row in csv.DictReader(handle):
        if not row["qty"].strip().isdigit():
            continue
        qty, price = int(row["qty"]), float(row["unit_price"])
        entry = report.setdefault(row["warehouse"], {"lines": 0, "units": 0, "value": 0.0})
        entry["lines"] += 1
        entry["units"] += qty
        entry["value"] += qty * price
for entry in report.values():
    entry["value"] = round(entry["value"], 2)
with open("/app/report.json", "w") as handle:
    json.dump(report, handle, indent=2)
PY
cat /app/report.json
