#!/bin/bash
set -euo pipefail
mkdir -p /app/output
python3 - <<'PY'
import csv, json
from collections import defaultdict

regions, customers, count, total = defaultdict(float), defaultdict(float), 0, 0.0
with open("/app/orders.csv", newline="") as handle:
    for row in csv.DictReader(handle):
        amount = float(row["amount"])
        regions[row["region"]] += amount
        customers[row["customer"]] += amount
        count, total = count + 1, total + amount
summary = {"orders": count, "grand_total": round(total, 2), "regions": {k: round(v, 2) for k, v in sorted(regions.items())}}
with open("/app/output/summary.json", "w") as handle:
    json.dump(summary, handle, indent=2)
top = sorted(customers, key=lambda name: customers[name], reverse=True)[:3]
with open("/app/output/top_customers.txt", "w") as handle:
    handle.write("\n".join(top) + "\n")
PY
