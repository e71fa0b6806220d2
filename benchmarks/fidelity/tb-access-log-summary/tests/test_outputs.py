import json
from pathlib import Path

SUMMARY = Path("/app/summary.json")


def load():
    assert SUMMARY.exists(), "summary.json was not written"
    return json.loads(SUMMARY.read_text())


def test_request_count():
    assert load()["requests"] == 8


def test_unique_ips():
    assert load()["unique_ips"] == 5


def test_status_counts():
    assert load()["status_counts"] == {"200": 4, "201": 1, "304": 1, "404": 1, "500": 1}


def test_top_path_ignores_query_string():
    assert load()["top_path"] == "/api/items"
