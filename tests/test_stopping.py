"""The stopping rule (``stop_at_ci_width``): its verdict after each round, and the configurations it refuses."""

from __future__ import annotations

import pytest
from tasks_factory import write_task

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.config import ConfigurationError
from prefect_harbor.stats.estimators import clustered_mean
from prefect_harbor.stats.stopping import StoppedEarly, StopRule, check_stopping
from prefect_harbor.storage.control import RowTracker
from prefect_harbor.storage.results import RowResult, to_table
from prefect_harbor.storage.spool import RowSpool


def recorded(rewards: list[list[float | None]]):
    """A results table: row i's attempts with these rewards (None: an agent failure, counted as 0)."""
    rows = []
    for index, attempts in enumerate(rewards):
        for number, reward in enumerate(attempts, start=1):
            failed = {"status": "failure", "err_category": "agent_error", "err_phase": "agent"}
            fields = {"status": "success", "reward": reward, "err_phase": None} if reward is not None else failed
            rows.append(RowResult(row_id=f"r{index}", row_index=index, attempt=number, task="t", **fields))
    return to_table(rows)


def test_a_round_whose_interval_is_narrow_enough_stops_the_sweep():
    rewards = [[float(i % 2), float((i + 1) % 2)] for i in range(30)]
    low, high = clustered_mean(rewards).ci95
    verdict = StopRule(width=high - low, attempts=4).after_round(2, recorded(rewards))
    assert verdict.stop
    assert verdict.reason.startswith("after attempt 2 of at most 4 per row, the mean's 95% interval is")
    assert verdict.reason.endswith(f"within stop_at_ci_width {high - low:.3g}: stopping")


def test_a_wide_interval_runs_the_next_round_until_the_attempts_are_spent():
    rewards = [[1.0], [0.0], [1.0]]
    rule = StopRule(width=0.1, attempts=3)
    assert rule.after_round(1, recorded(rewards)) == rule.after_round(1, recorded(rewards))
    going_on = rule.after_round(1, recorded(rewards))
    assert not going_on.stop and going_on.reason.endswith("wider than 0.1: running attempt 2")
    spent = rule.after_round(3, recorded(rewards))
    assert spent.stop and spent.reason.endswith("wider than 0.1: the attempts are spent")


def test_agent_failures_count_as_zero_in_the_interval_the_rule_reads():
    with_failures = StopRule(width=2.0, attempts=2).after_round(1, recorded([[1.0], [None], [1.0], [None]]))
    as_zeros = StopRule(width=2.0, attempts=2).after_round(1, recorded([[1.0], [0.0], [1.0], [0.0]]))
    assert with_failures.reason == as_zeros.reason


def test_no_interval_yet_says_why_and_goes_on():
    continuous = [[0.25], [0.5]]  # a bootstrap over rows needs more rows
    verdict = StopRule(width=1.0, attempts=2).after_round(1, recorded(continuous))
    assert not verdict.stop and "no interval yet (too few rows for an interval" in verdict.reason and verdict.reason.endswith("running attempt 2")
    nothing = StopRule(width=1.0, attempts=2).after_round(1, recorded([]))
    assert "no attempt was counted" in nothing.reason


@pytest.mark.parametrize(
    ("width", "attempts", "options", "message"),
    [
        (0.0, 3, {}, "stop_at_ci_width: 0.0 is not a width; give a positive number"),
        (0.1, 1, {}, "stop_at_ci_width: it adds attempts until the interval is 0.1 wide, and attempts is 1; give attempts 2 or more"),
        (0.1, 3, {"sharded": True}, "stop_at_ci_width: the stopping rule decides over every row after each round, on one host; drop shards"),
        (0.1, 3, {"rerun": True}, "stop_at_ci_width: a re-run of failed attempts runs exactly those attempts; drop rerun_failed"),
    ],
    ids=["not-a-width", "one-attempt", "shards", "rerun"],
)
def test_a_rule_the_sweep_cannot_honour_is_refused_naming_the_field(width, attempts, options, message):
    with pytest.raises(ConfigurationError, match=message):
        check_stopping(width, attempts, **options)
    check_stopping(None, attempts, **options)  # no rule: nothing to refuse


def test_the_block_refuses_a_rule_without_attempts_to_add(tmp_path):
    write_task(tmp_path / "tasks", "t")
    with pytest.raises(ValueError, match="give attempts 2 or more"):
        HarborBackend(tasks_dir=tmp_path / "tasks", agent="oracle", stop_at_ci_width=0.2)
    block = HarborBackend(tasks_dir=tmp_path / "tasks", agent="oracle", stop_at_ci_width=0.2, attempts=5)
    assert block.spec().limits.stop_at_ci_width == 0.2


def test_a_sweep_stopped_early_is_reported_with_the_attempts_it_ran(tmp_path):
    write_task(tmp_path / "tasks", "t")
    spec = HarborBackend(tasks_dir=tmp_path / "tasks", agent="oracle", stop_at_ci_width=0.2, attempts=5).spec()
    early = StoppedEarly(2, 5, "the mean's 95% interval is 0.15 wide (0.4 to 0.55), within stop_at_ci_width 0.2: stopping")
    assert early.spec_of(spec).limits.attempts == 2 and spec.limits.attempts == 5
    assert early.phrase() == "stopped after 2 of at most 5 attempts per row: the mean's 95% interval is 0.15 wide (0.4 to 0.55), within stop_at_ci_width 0.2: stopping"


def test_attempts_the_rule_did_not_need_leave_the_live_status():
    tracker = RowTracker(["a", "b"], attempts=4)
    for row_id in ("a", "b"):
        for attempt in (1, 2):
            tracker.set(row_id, "success", attempt)
    assert tracker.status("a") == "queued"
    tracker.forget_attempts_after(2)
    assert tracker.statuses == {"a": "success", "b": "success"} and tracker.attempts["a"] == {1: "success", 2: "success"}


def test_the_spool_reads_its_rows_so_far_and_takes_more(tmp_path):
    spool = RowSpool(tmp_path / "rows.arrows")
    assert spool.snapshot().num_rows == 0
    spool.add(recorded([[1.0, 0.0]]))
    assert spool.snapshot().num_rows == 2
    spool.add(recorded([[1.0]]))
    assert spool.snapshot().num_rows == 3 and spool.drain().num_rows == 3
