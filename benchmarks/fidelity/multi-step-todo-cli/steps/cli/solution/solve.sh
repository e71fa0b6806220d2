#!/bin/bash
set -euo pipefail
cat > /app/todo.py <<'PY'
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import todo_store  # noqa: E402


def main(argv):
    path = os.environ.get("TODO_FILE", os.path.expanduser("~/todo.json"))
    command, *args = argv or ["list"]
    if command == "add":
        print(f"added {todo_store.add(path, ' '.join(args))['id']}")
    elif command == "done":
        try:
            todo_store.complete(path, int(args[0]))
        except (KeyError, ValueError, IndexError):
            print("no such item", file=sys.stderr)
            return 1
        print(f"done {args[0]}")
    elif command == "list":
        for item in todo_store.load(path):
            print(f"[{'x' if item['done'] else ' '}] {item['id']} {item['title']}")
    else:
        print(f"unknown command {command}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
PY
