import json
from pathlib import Path

REPORT = Path("/app/report.json")


def load():
    return json.loads(REPORT.read_text())


def test_report_exists_and_is_json():
    assert REPORT.is_file()
    assert isinstance(load(), dict)


def test_one_entry_per_warehouse_with_whole_quantities():
    assert set(load()) == {"north", "south", "east"}


def test_counts_and_units_skip_lines_without_a_whole_quantity():
    report = load()
    assert (report["north"]["lines"], report["north"]["units"]) == (2, 14)
    assert (report["south"]["lines"], report["south"]["units"]) == (2, 8)
    assert (report["east"]["lines"], report["east"]["units"]) == (2, 8)


def test_values_are_rounded_to_cents():
    report = load()
    assert report["north"]["value"] == 19.9
    assert report["south"]["value"] == 37.66
    assert report["east"]["value"] == 107.7
