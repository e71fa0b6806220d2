import sys

import pytest

sys.path.insert(0, "/app")
import todo_store  # noqa: E402


def test_missing_file_is_empty(tmp_path):
    assert todo_store.load(tmp_path / "todo.json") == []


def test_add_and_complete(tmp_path):
    path = tmp_path / "todo.json"
    assert todo_store.add(path, "buy milk") == {"id": 1, "title": "buy milk", "done": False}
    assert todo_store.add(path, "walk dog")["id"] == 2
    todo_store.complete(path, 1)
    assert [i["done"] for i in todo_store.load(path)] == [True, False]


def test_unknown_id(tmp_path):
    with pytest.raises(KeyError):
        todo_store.complete(tmp_path / "todo.json", 7)
