"""Prewarm: each selected task is set up once, install-only, before its rows; a failure fails its rows at once."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from tasks_factory import write_task

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.flows.prewarm import PREWARM_KEY, prewarm_flow

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    """A good task and one whose image cannot be built."""
    root = tmp_path / "tasks"
    write_task(root, "good")
    bad = write_task(root, "bad")
    (bad / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nRUN echo the-build-breaks-here && exit 7\n")
    return root


def backend(tmp_path: Path, tasks: Path) -> HarborBackend:
    return HarborBackend(tasks_dir=tasks, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"))


async def test_a_task_that_fails_prewarm_fails_its_rows_with_the_reason(tmp_path, tasks):
    dataset = tmp_path / "rows.jsonl"
    rows = [{"id": f"{task}-{n}", "metadata": {"harbor_task_id": task}} for task in ("good", "bad") for n in range(2)]
    dataset.write_text("\n".join(json.dumps(r) for r in rows))

    summary = await evaluation_sweep(dataset=str(dataset), backend=backend(tmp_path, tasks), results=str(tmp_path / "results"))

    table = {r["row_id"]: r for r in pq.read_table(summary.results_uri).to_pylist()}
    assert [table[f"good-{n}"]["reward"] for n in range(2)] == [1.0, 1.0]
    for n in range(2):
        row = table[f"bad-{n}"]
        assert (row["status"], row["err_category"], row["err_phase"]) == ("failure", "validation_error", "setup")
        assert row["err_message"].startswith("task bad failed prewarm: image build failed:") and "the-build-breaks-here" in row["err_message"]
        assert row["total_sec"] is None  # no trial was started for it
    async with get_client() as client:
        artifacts = await client.read_latest_artifacts()
    assert any(a.key == PREWARM_KEY for a in artifacts)
    (run,) = (tmp_path / "results").glob("*/manifest.json")
    assert "the-build-breaks-here" in (run.parent / "prewarm" / "bad.build.log").read_text(), "the failed build's log was not archived"


async def test_the_prewarm_flow_reports_each_task_and_leaves_no_trial(tmp_path, tasks):
    results = await prewarm_flow(backend=backend(tmp_path, tasks), task_ids=["good", "bad", "missing"])

    by_task = {r.task: r for r in results}
    assert by_task["good"].ok and by_task["good"].error is None
    assert not by_task["bad"].ok and "image build failed" in by_task["bad"].error and by_task["bad"].build_log
    assert not by_task["missing"].ok and "unknown harbor task id 'missing'" in by_task["missing"].error
    assert not any((tmp_path / "trials").rglob("result.json"))


async def test_a_setup_that_passed_here_is_not_set_up_again_until_it_changes(tmp_path, tasks, monkeypatch):
    import prefect_harbor.trial.prewarm as prewarm

    monkeypatch.setenv("PREFECT_HARBOR_CACHE", str(tmp_path / "cache"))
    (first,) = await prewarm_flow(backend=backend(tmp_path, tasks), task_ids=["good"])
    assert first.ok and not first.reused and len(list((tmp_path / "cache" / "prewarmed").iterdir())) == 1

    async def must_not_run(*args, **kwargs):
        raise AssertionError("the install-only trial ran again")

    monkeypatch.setattr(prewarm, "_install_only_trial", must_not_run)
    state = await prewarm_flow(backend=backend(tmp_path, tasks), task_ids=["good"], return_state=True)
    (second,) = await state.result()
    assert second.ok and second.reused, second.error
    async with get_client() as client:
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert [run.name for run in runs] == ["find tasks set up before"], "a task set up before still got a prewarm task run of its own"
    with (tasks / "good" / "task.toml").open("a") as toml:
        toml.write("\n# an edit: another setup\n")
    (third,) = await prewarm_flow(backend=backend(tmp_path, tasks), task_ids=["good"])
    assert not third.ok and not third.reused and "ran again" in third.error
