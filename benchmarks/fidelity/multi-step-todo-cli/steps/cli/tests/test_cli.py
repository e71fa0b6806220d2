import os
import subprocess
import sys


def todo(tmp_path, *args):
    env = {**os.environ, "TODO_FILE": str(tmp_path / "list.json")}
    return subprocess.run([sys.executable, "/app/todo.py", *args], capture_output=True, text=True, env=env)


def test_add_done_list(tmp_path):
    assert todo(tmp_path, "add", "write", "report").stdout.strip() == "added 1"
    assert todo(tmp_path, "add", "ship").stdout.strip() == "added 2"
    assert todo(tmp_path, "done", "1").stdout.strip() == "done 1"
    assert todo(tmp_path, "list").stdout.splitlines() == ["[x] 1 write report", "[ ] 2 ship"]


def test_unknown_id_fails(tmp_path):
    assert todo(tmp_path, "done", "9").returncode == 1
