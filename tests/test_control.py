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


def test_a_row_that_starts_is_marked_with_the_host_that_runs_it_and_a_merge_keeps_each_hosts():
    here = RowTracker(["a", "b", "c"], host="host-1")
    here.set("a", "running")
    here.set("a", "success")
    here.set("b", "cancelled")  # never started here: no host
    assert json.loads(here.snapshot("Running"))["hosts"] == {"a": "host-1"}

    merged = RowTracker(["a", "b", "c"])  # a sweep on many hosts: its shards name the hosts
    merged.set("a", "success", host="host-1")
    merged.set("c", "running", host="host-2")
    merged.set("b", "running")
    assert json.loads(merged.snapshot("Running"))["hosts"] == {"a": "host-1", "c": "host-2"}
    assert "hosts" not in json.loads(RowTracker(["a"]).snapshot("Running"))
