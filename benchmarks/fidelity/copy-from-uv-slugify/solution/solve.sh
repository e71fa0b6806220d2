#!/bin/bash
set -euo pipefail

cat > /app/slugify.py <<'PY'
"""Titles to URL slugs."""

import re
import unicodedata


def slugify(title: str) -> str:
    ascii_title = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return "-".join(re.findall(r"[a-z0-9]+", ascii_title.lower()))
PY
cd /app && uv run --no-project python -c 'from slugify import slugify; print(slugify("  Hello, World! 2024 "))'
