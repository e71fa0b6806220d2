#!/bin/bash
cd /app
python3 - <<'PY'
import ast
import pathlib
import sys

problems = []
if sys.version_info[:2] != (3, 13):
    problems.append(f"python3 is {sys.version.split()[0]}, the image's tag says 3.13")
try:
    from batches import Order, reprice

    batches = reprice([Order("a", 10.0), Order("b", 2.5), Order("c", 1.0)], 2, 1.1)
    if batches != [(Order("a", 11.0), Order("b", 2.75)), (Order("c", 1.1),)]:
        problems.append(f"reprice returned {batches!r}")
    names = {node.attr for node in ast.walk(ast.parse(pathlib.Path("batches.py").read_text())) if isinstance(node, ast.Attribute)}
    if not {"batched", "replace"} <= names:
        problems.append("batches.py does not use itertools.batched and copy.replace")
except Exception as error:  # the agent's module may not import at all
    problems.append(f"{type(error).__name__}: {error}")
print("\n".join(problems) or "all checks passed")
pathlib.Path("/logs/verifier/reward.txt").write_text("0\n" if problems else "1\n")
PY
