#!/bin/bash
set -euo pipefail
cd /app/src/textstats

python3 - <<'PY'
from pathlib import Path

path = Path("core.py")
source = path.read_text()
source = source.replace(
    '_WORD = re.compile(r"[A-Za-z]+")',
    "_WORD = re.compile(r\"[A-Za-z]+(?:'[A-Za-z]+)*\")",
)
source = source.replace(
    "    found = words(text)\n    return",
    "    found = words(text)\n    if not found:\n        return 0.0\n    return",
)
path.write_text(source)
PY
python3 -c "import textstats; print(textstats.words(\"don't stop\"), textstats.mean_word_length(''))"
