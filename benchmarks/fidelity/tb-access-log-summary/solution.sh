#!/bin/bash
set -euo pipefail

python3 - <<'PY'
import collections
import json
import re

line_re = re.compile(r'^(\S+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+) [^"]*" (\d{3}) \S+$')
ips, statuses, paths = set(), collections.Counter(), collections.Counter()
total = 0
with open("/app/access.log") as log:
    for line in log:
        match = line_re.match(line.strip())
        if not match:
            continue
        ip, _method, target, status = match.groups()
        total += 1
        ips.add(ip)
        statuses[status] += 1
        paths[target.split("?", 1)[0]] += 1

summary = {
    "requests": total,
    "unique_ips": len(ips),
    "status_counts": dict(sorted(statuses.items())),
    "top_path": paths.most_common(1)[0][0],
}
with open("/app/summary.json", "w") as out:
    json.dump(summary, out, indent=2)
PY
cat /app/summary.json
