#!/bin/bash
python3 - <<'PY'
from pathlib import Path

ok = True
try:
    lines = [line.strip() for line in Path("/app/REPORT.md").read_text().strip().splitlines()]
except OSError as error:
    print(error)
    lines, ok = [], False

def cells(line):
    return [c.strip() for c in line.strip("|").split("|")]

if len(lines) != 6:
    print(f"want a header, a rule and 4 rows; got {len(lines)} lines")
    ok = False
else:
    if cells(lines[0]) != ["Benchmark", "Runs", "Mean (ms)"]:
        print("header:", lines[0]); ok = False
    if not set(lines[1]) <= set("|-: "):
        print("rule:", lines[1]); ok = False
    want = [["parse_small", "200", "1.2"], ["serialize", "100", "7.0"], ["roundtrip", "50", "12.5"], ["parse_large", "20", "49.0"]]
    got = [cells(line) for line in lines[2:]]
    if got != want:
        print("rows:", got); ok = False

Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
print("PASS" if ok else "FAIL")
PY
