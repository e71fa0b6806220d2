"""Partial-cancellation dispositions and the live status vocabulary."""

import json

from prefect_harbor.storage.control import CancelRequest, RowTracker, status_of


def tracker() -> RowTracker:
    rows = RowTracker(["a1", "a2", "b1", "done"])
    rows.set("a1", "running")
    rows.set("b1", "grading")
    rows.set("done", "success")
    return rows


def test_dispositions_follow_the_osmosis_vocabulary():
    rows = tracker()
    dispositions, running = rows.apply(CancelRequest(ids=["done", "ghost", "b1"], prefixes=["a", "zz"]))
    assert dispositions == {
        "done": "not_found", "ghost": "not_found", "b1": "cancelled_running",
        "a1": "cancelled_running", "a2": "cancelled_queued", "zz*": "not_found",
    }  # fmt: skip
    assert sorted(running) == ["a1", "b1"]
    assert rows.cancelled_ids == {"a1", "a2", "b1"}


def test_all_targets_every_row():
    dispositions, _ = tracker().apply(CancelRequest(all=True))
    assert dispositions == {"a1": "cancelled_running", "a2": "cancelled_queued", "b1": "cancelled_running", "done": "not_found"}


def test_status_snapshots_count_rows_and_answer_unknown_ids():
    snapshot = json.loads(tracker().snapshot("Running"))
    assert snapshot["counts"] == {"running": 1, "queued": 1, "grading": 1, "success": 1}
    assert status_of(snapshot, "a2") == "queued" and status_of(snapshot, "nope") == "unknown"


def test_finished_counts_attempts_with_a_result_whatever_it_was():
    tracker = RowTracker(["a", "b", "c"], attempts=2)
    for row_id, attempt, status in [("a", 1, "success"), ("a", 2, "failure"), ("b", 1, "running"), ("c", 2, "cancelled"), ("c", 1, "grading")]:
        tracker.set(row_id, status, attempt)
    assert tracker.finished == 3
