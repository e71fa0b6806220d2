#!/bin/bash
set -euo pipefail
cd /app
rm -f sales.db
sqlite3 sales.db <<'SQL'
.mode csv
.import data/regions.csv regions
.import data/orders.csv orders
.headers on
.output report.csv
SELECT r.name AS region,
       COUNT(*) AS orders,
       printf('%.2f', SUM(CAST(o.amount_cents AS INTEGER)) / 100.0) AS total
FROM orders o JOIN regions r ON r.region_id = o.region_id
GROUP BY r.name
ORDER BY SUM(CAST(o.amount_cents AS INTEGER)) DESC;
SQL
cat report.csv
