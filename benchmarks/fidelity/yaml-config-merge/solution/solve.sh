#!/bin/bash
set -euo pipefail
cd /app

cat > merge_config.py <<'PY'
import json
import sys

import yaml


def merge(base, override):
    result = dict(base)
    for key, value in override.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merge(result[key], value)
        else:
            result[key] = value
    return result


def main():
    with open("/app/config/base.yaml") as f:
        base = yaml.safe_load(f) or {}
    with open("/app/config/production.yaml") as f:
        override = yaml.safe_load(f) or {}
    json.dump(merge(base, override), sys.stdout, indent=2, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
PY

python3 merge_config.py > merged.json
cat merged.json
