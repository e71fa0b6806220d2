"""Checks the agent's /app/output, copied into this container as an artifact."""

import json
from pathlib import Path

import pytest

OUTPUT = Path("/app/output")


def test_summary_has_the_counts_and_totals():
    summary = json.loads((OUTPUT / "summary.json").read_text())
    assert summary["orders"] == 14
    assert summary["grand_total"] == pytest.approx(8764.54, abs=0.005)
    assert summary["regions"] == pytest.approx({"east": 572.79, "north": 4592.85, "south": 883.05, "west": 2715.85}, abs=0.005)


def test_top_customers_are_the_three_biggest_spenders_in_order():
    names = (OUTPUT / "top_customers.txt").read_text().strip().splitlines()
    assert names == ["Delta Freight", "Cobalt Tools", "Avery Lumber"]
