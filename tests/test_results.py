"""The results table: schema, incremental parts, compaction and the summary."""

import re
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from paths import REPO

from prefect_harbor.storage.results import RESULTS_SCHEMA, RowResult, RunTally
from prefect_harbor.storage.run_store import RunStore


def row(index, task="t", status="success", reward=1.0, **fields):
    return RowResult(row_index=index, row_id=f"r{index}", task=task, status=status, reward=reward, **fields)


def test_each_finished_row_is_readable_before_the_sweep_ends(tmp_path):
    writer = RunStore(str(tmp_path), "run1", fallback_dir=tmp_path / "fallback")
    writer.write_row(row(0, rewards={"reward": 1.0, "style": 0.5}))
    writer.write_row(row(1, status="failure", reward=None, err_category="agent_error", err_message="boom"))
    table = pq.read_table(str(tmp_path / "run1" / "parts"))
    assert table.schema.equals(RESULTS_SCHEMA)
    assert sorted(table.column("row_id").to_pylist()) == ["r0", "r1"]


def test_finalize_compacts_in_row_order_and_drops_the_parts(tmp_path):
    writer = RunStore(str(tmp_path), "run1", fallback_dir=tmp_path / "fallback")
    rows = [row(2), row(0, reward=0.0), row(1, started_at=datetime(2026, 1, 1, tzinfo=UTC))]
    for result in rows:
        writer.write_row(result)
    uri = writer.finalize()
    assert uri == f"file://{tmp_path}/run1/results.parquet"
    table = pq.read_table(uri)
    assert table.column("row_index").to_pylist() == [0, 1, 2]
    assert table.column("reward").to_pylist() == [0.0, 1.0, 1.0]
    assert not (tmp_path / "run1" / "parts").exists()


def test_rewards_map_round_trips(tmp_path):
    writer = RunStore(str(tmp_path), "run1", fallback_dir=tmp_path / "fallback")
    writer.write_row(row(0, rewards={"reward": 1.0, "format": 0.0}))
    uri = writer.finalize()
    assert pq.read_table(uri).column("rewards").to_pylist() == [[("reward", 1.0), ("format", 0.0)]]


def test_summary_counts_and_means():
    tally = RunTally()
    for result in [row(0, "a", reward=1.0), row(1, "a", reward=0.0), row(2, "b", status="failure", reward=None), row(3, "b", status="cancelled", reward=None)]:
        tally.add(result)
    summary = tally.summary("run1", "uri")
    assert (summary.rows, summary.success, summary.failure, summary.cancelled) == (4, 2, 1, 1)
    assert summary.mean_reward == 0.5
    assert summary.per_task["a"].mean_reward == 0.5
    assert summary.per_task["b"].mean_reward is None


def test_small_sweeps_get_a_task_run_per_row_and_big_ones_batches():
    from prefect_harbor.flows.lanes import MAX_ROWS_PER_TASK_RUN, default_rows_per_task_run

    assert default_rows_per_task_run(5, 4) == 1
    assert default_rows_per_task_run(40, 4) == 1
    assert default_rows_per_task_run(41, 4) == 2
    assert default_rows_per_task_run(500, 4) == 13
    assert default_rows_per_task_run(10_000, 4) == MAX_ROWS_PER_TASK_RUN
    assert default_rows_per_task_run(0, 4) == 1


def test_a_run_with_no_rows_finalizes_an_empty_table(tmp_path):
    uri = RunStore(str(tmp_path), "run1", fallback_dir=tmp_path / "fallback").finalize()
    assert pq.read_table(uri).schema.equals(RESULTS_SCHEMA) and pq.read_table(uri).num_rows == 0


def test_the_tally_keeps_the_report_examples_without_keeping_every_row():
    from prefect_harbor.flows.reporting import report_markdown

    tally = RunTally(failures_kept=2, slowest=2)
    for index in range(1000):
        failed = index % 2 == 1
        tally.add(row(index, status="failure" if failed else "success", reward=None if failed else 1.0, total_sec=index % 7,
                      err_category="agent_error" if failed else None, err_message=f"boom {index}" if failed else None))  # fmt: skip
    summary = tally.summary("run1", "uri")
    # The agent's own errors count as 0 (the scoring contract).
    assert (summary.rows, summary.success, summary.failure, summary.mean_reward, summary.agent_failures) == (1000, 500, 500, 0.5, 500)
    assert [r.row_id for r in tally.failures["agent_error"]] == ["r1", "r3"]
    assert [(r.total_sec, r.row_id) for r in tally.slowest()] == [(6.0, "r6"), (6.0, "r13")]
    report = report_markdown(summary, tally)
    assert "### agent_error (500)" in report and "| … | 498 more in the results table | | |" in report
    assert "boom 1 " in report and "boom 5 " not in report


def test_the_spool_keeps_every_row_across_batches(tmp_path, monkeypatch):
    import prefect_harbor.storage.spool as spool

    monkeypatch.setattr(spool, "SPOOL_BATCH", 4)
    writer = RunStore(str(tmp_path), "run1", fallback_dir=tmp_path / "fallback")
    for index in reversed(range(10)):  # 2 full batches and 2 pending rows at the end
        writer.write_row(row(index))
    table = pq.read_table(writer.finalize())
    assert table.column("row_index").to_pylist() == list(range(10))
    assert not writer.spool_path.exists()


def test_a_report_with_no_scored_row_says_so_in_words():
    from prefect_harbor.flows.reporting import report_markdown

    tally = RunTally()
    tally.add(RowResult(row_index=0, row_id="q0", task="slow", status="cancelled", err_message="cancelled before it started"))
    report = report_markdown(tally.summary("r", "file:///results.parquet"), tally)
    assert "no row was scored, so there is no mean reward." in report and "mean reward -" not in report


def test_a_report_of_several_attempts_counts_trials_and_names_each_failures_attempt():
    from prefect_harbor.flows.reporting import report_markdown

    tally = RunTally()
    for attempt in (1, 2):
        tally.add(RowResult(row_index=0, row_id="q0", attempt=attempt, task="t", status="failure", err_category="agent_error", err_message=f"boom {attempt}"))
    tally.add(RowResult(row_index=1, row_id="q1", attempt=1, task="u", status="success", reward=1.0))
    tally.add(RowResult(row_index=1, row_id="q1", attempt=2, task="u", status="cancelled"))
    summary = tally.summary("r", "file:///results.parquet", attempts=2)
    report = report_markdown(summary, tally)
    assert report.splitlines()[2].startswith("4 trials (2 rows × 2 attempts): 1 success, 2 failure, 1 cancelled;"), report
    assert "| row | attempt | task | phase | message |" in report
    assert "| q0 | 1 | t | - | boom 1 |" in report and "| q0 | 2 | t | - | boom 2 |" in report
    # The summary artifact's per-task columns are filled, as the overall row's are.
    score = lambda task: summary.per_task[task].model_dump()  # noqa: E731
    assert score("t") == {"rows": 1, "trials": 2, "mean_reward": 0.0, "success": 0, "failure": 2, "cancelled": 0, "agent_failures": 2, "not_scored": 0}
    assert score("u") == {"rows": 1, "trials": 2, "mean_reward": 1.0, "success": 1, "failure": 0, "cancelled": 1, "agent_failures": 0, "not_scored": 0}
    # One vocabulary: rows are the dataset's, trials one per row and attempt, in the summary as in its statistics.
    assert (summary.rows, summary.trials, summary.success + summary.failure + summary.cancelled) == (2, 4, 4)


async def test_the_progress_ends_at_the_final_count_after_a_cancel(monkeypatch):
    from prefect_harbor.flows import reporting

    shown: list[float] = []

    async def update(artifact_id, percent):
        shown.append(percent)

    monkeypatch.setattr(reporting, "aupdate_progress_artifact", update)
    progress = reporting.Progress(total=6, interval=3600)
    progress.artifact_id = "artifact"
    await progress.advance()  # 16.7 %, then a cancel: the other rows are recorded without advancing
    await progress.finish(recorded=6)
    assert shown == [16.7, 100.0]


async def test_the_row_table_is_published_while_the_sweep_runs_and_updated_in_place(monkeypatch):
    """After the first row, then every ``every`` rows (or ``interval`` seconds), then at the end: one artifact,
    made once and updated (not a card per version, the first still saying "1 of 5 so far")."""
    from prefect_harbor.flows import reporting

    published: list[tuple[str, list[str], str]] = []

    async def create(key, table, description):
        published.append((f"create {key}", [r["row"] for r in table], description))
        return "artifact-id"

    async def update(artifact_id, table, description):
        published.append((f"update {artifact_id}", [r["row"] for r in table], description))

    monkeypatch.setattr(reporting, "acreate_table_artifact", create)
    monkeypatch.setattr(reporting, "aupdate_table_artifact", update)
    tally = RunTally()
    table = reporting.RowsTable(tally, total=5, interval=3600, every=3)
    for index in range(5):
        tally.add(row(index, artifact_uri=f"file:///r/archives/r{index}"))
        await table.advance()
    await table.finish(tally.summary("run", "file:///r/results.parquet"))
    assert [(what, rows) for what, rows, _ in published] == [
        ("create evaluation-sweep-rows", ["r0"]),
        ("update artifact-id", ["r0", "r1", "r2", "r3"]),
        ("update artifact-id", ["r0", "r1", "r2", "r3", "r4"]),
    ]
    assert published[0][2].endswith("1 of 5 so far.") and published[-1][2].startswith("Row by row: the first 5 of 5 rows")


def test_the_results_schema_derived_from_the_model_is_the_documented_one():
    # The README's Results section documents these columns and types; readers of old runs depend on them.
    documented = pa.schema([
        ("row_index", pa.int64()), ("row_id", pa.string()), ("attempt", pa.int64()), ("tries", pa.int64()), ("task", pa.string()), ("agent", pa.string()),
        ("model", pa.string()), ("status", pa.string()), ("reward", pa.float64()), ("rewards", pa.map_(pa.string(), pa.float64())),
        ("err_category", pa.string()), ("err_message", pa.string()), ("err_phase", pa.string()), ("exception_type", pa.string()),
        ("verifier_mode", pa.string()), ("failure_cause", pa.string()),
        ("environment_setup_sec", pa.float64()), ("agent_setup_sec", pa.float64()), ("agent_sec", pa.float64()), ("verifier_sec", pa.float64()),
        ("total_sec", pa.float64()), ("input_tokens", pa.int64()), ("cached_tokens", pa.int64()), ("output_tokens", pa.int64()),
        ("cost_usd", pa.float64()), ("final_messages", pa.string()), ("host", pa.string()), ("trial_name", pa.string()), ("trial_dir", pa.string()),
        ("artifact_uri", pa.string()), ("archive_error", pa.string()), ("certification", pa.string()),
        ("verifier_tampering", pa.list_(pa.string())),
        ("hosts_tried", pa.list_(pa.string())),
        ("started_at", pa.timestamp("us", tz="UTC")), ("finished_at", pa.timestamp("us", tz="UTC")),
    ])  # fmt: skip
    assert RESULTS_SCHEMA.equals(documented), RESULTS_SCHEMA


def test_a_result_field_of_a_type_parquet_cannot_hold_is_named():
    from prefect_harbor.storage.results import arrow_type

    with pytest.raises(TypeError, match="has no Parquet column type"):
        arrow_type(set[str])


def test_the_readme_documents_every_column_of_the_results_table():
    section = (REPO / "README.md").read_text().split("### The results table", 1)[1].split("\n#", 1)[0]
    documented = {name for cell in re.findall(r"^\| ([^|]+) \|", section, re.MULTILINE) for name in re.findall(r"`(\w+)`", cell)}
    assert set(RESULTS_SCHEMA.names) - documented == set()
