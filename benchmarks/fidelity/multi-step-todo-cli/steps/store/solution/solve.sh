#!/bin/bash
set -euo pipefail
cat > /app/todo_store.py <<'PY'
import json
import os


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def _save(path, items):
    with open(path, "w") as f:
        json.dump(items, f, indent=2)


def add(path, title):
    items = load(path)
    item = {"id": max((i["id"] for i in items), default=0) + 1, "title": title, "done": False}
    items.append(item)
    _save(path, items)
    return item


def complete(path, item_id):
    items = load(path)
    for item in items:
        if item["id"] == item_id:
            item["done"] = True
            _save(path, items)
            return
    raise KeyError(item_id)
PY
