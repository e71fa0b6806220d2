"""Every attempt's result row is redacted and archived exactly once, whichever way it ends: a trial
that succeeds or fails, a row refused before any trial, a crash, an archive that fails, a row
cancelled while it runs; in task runs of one row or of several, with attempts, and on a
distributed task runner. The trials are stand-ins (no sandbox): what is counted is the sweep's own
bookkeeping around them, through the flow on a real server."""

import asyncio
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tasks_factory import write_task

import prefect_harbor.secrets
import prefect_harbor.tasks.archive
import prefect_harbor.tasks.trial
from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.rows.dataset import RowProblem
from prefect_harbor.storage.control import CancelRequest
from prefect_harbor.storage.results import RowResult
from prefect_harbor.trial.row_trial import base_result

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(300)]

#: Row id -> how its stand-in trial ends; "rejected" and the malformed line go through the real run_row (no trial starts).
ENDINGS = {"passes": "success", "fails": "failure", "crashes": "failure", "archive-breaks": "success", "rejected": "failure", "cancelled": "cancelled"}


def dataset(path: Path, rows: list[str]) -> Path:
    lines = [json.dumps({"id": row_id, "metadata": {"harbor_task_id": "no-such-task" if row_id == "rejected" else "t"}}) for row_id in rows]
    path.write_text("\n".join([*lines, "{not json"]) + "\n")
    return path


class Counts:
    """How often each attempt's row was archived and redacted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, results: Path):
        self.archived: Counter[tuple[str, int]] = Counter()
        self.redacted: Counter[tuple[str, int]] = Counter()
        self.results = results
        real_archive, real_redact, real_run_row = prefect_harbor.tasks.archive.archive_row, prefect_harbor.secrets.Redactor.model, prefect_harbor.tasks.trial.run_row

        def archive_row(result: RowResult, *args, **kwargs):
            self.archived[result.row_id, result.attempt] += 1
            if result.row_id == "archive-breaks":
                raise OSError("the store is away")
            return real_archive(result, *args, **kwargs)

        def redact(redactor, model):
            if isinstance(model, RowResult):
                self.redacted[model.row_id, model.attempt] += 1
            return real_redact(redactor, model)

        async def run_row(row, index, trial_name, backend, resolver, run, *rest, **options):
            if isinstance(row, RowProblem) or row.id == "rejected":
                return await real_run_row(row, index, trial_name, backend, resolver, run, *rest, **options)
            attempt = options.get("attempt", rest[2] if len(rest) > 2 else 1)
            base = base_result(row, index, backend, attempt).model_copy(update={"trial_name": trial_name})
            if row.id == "crashes":
                raise RuntimeError("a bug in the trial task")
            if row.id == "cancelled":  # asks for its own cancellation, as `prefect-harbor cancel` does, and runs until it comes
                request = CancelRequest(ids=[row.id])
                path = self.results / run.run_id / request.path
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(request.model_dump_json())
                await asyncio.Event().wait()
            trial_dir = run.trials_dir / trial_name
            (trial_dir / "verifier").mkdir(parents=True)
            (trial_dir / "trial.log").write_text("ran\n")
            if row.id == "fails":
                return base.model_copy(update={"err_category": "agent_error", "err_message": "the agent gave up", "trial_dir": str(trial_dir)})
            return base.model_copy(update={"status": "success", "reward": 1.0, "err_phase": None, "trial_dir": str(trial_dir)})

        monkeypatch.setattr(prefect_harbor.tasks.archive, "archive_row", archive_row)
        monkeypatch.setattr(prefect_harbor.secrets.Redactor, "model", redact)
        monkeypatch.setattr(prefect_harbor.tasks.trial, "run_row", run_row)


@pytest.mark.parametrize(
    ("rows_per_task_run", "attempts", "distributed"),
    [(1, 1, False), (5, 1, False), (None, 2, False), (None, 1, True)],
    ids=["row-per-task-run", "batched", "attempts", "distributed"],
)
async def test_every_row_is_redacted_and_archived_exactly_once(tmp_path, monkeypatch, rows_per_task_run, attempts, distributed):
    write_task(tmp_path / "tasks", "t")  # never built: the stand-in trials run nothing
    # A cancelled row on a distributed runner ends in the flow, its worker's trial runs on; its stand-in would wait for ever.
    rows = [row_id for row_id in ENDINGS if not (distributed and row_id == "cancelled")]
    counts = Counts(monkeypatch, tmp_path / "results")
    backend = HarborBackend(tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), n_concurrent=2)
    sweep = evaluation_sweep
    if distributed:
        from prefect_dask import DaskTaskRunner

        sweep = evaluation_sweep.with_options(task_runner=DaskTaskRunner(cluster_kwargs={"n_workers": 1, "processes": False, "dashboard_address": None}))

    summary = await sweep(
        dataset=str(dataset(tmp_path / "rows.jsonl", rows)), backend=backend, results=str(tmp_path / "results"), prewarm=False,
        rows_per_task_run=rows_per_task_run, attempts=attempts,
    )  # fmt: skip

    table = pq.read_table(summary.results_uri).to_pylist()
    statuses = {(r["row_id"], r["attempt"]): r["status"] for r in table}
    problem = next(r["row_id"] for r in table if r["row_id"] not in ENDINGS)
    expected = {(row_id, attempt): ENDINGS[row_id] for row_id in rows for attempt in range(1, attempts + 1)}
    assert statuses == {**expected, **{(problem, attempt): "failure" for attempt in range(1, attempts + 1)}}
    assert {r["row_id"]: r["archive_error"] is not None for r in table} == {row_id: row_id == "archive-breaks" for row_id in [*rows, problem]}
    assert dict(counts.archived) == dict.fromkeys(statuses, 1), "each attempt archived once"
    assert dict(counts.redacted) == dict.fromkeys(statuses, 1), "each attempt's row redacted once"


async def test_a_not_scored_try_is_tried_again_up_to_the_limit_and_the_row_says_how_many(tmp_path, monkeypatch):
    """Stand-in trials: one sandbox fails once, one always, one verifier fails (never retried: it would fail again)."""
    from prefect.client.orchestration import get_client
    from prefect_reads import logs_of

    from prefect_harbor.scoring import scoring_of

    write_task(tmp_path / "tasks", "t")
    calls: Counter[str] = Counter()

    async def run_row(row, index, trial_name, backend, resolver, run, *rest, **options):
        calls[row.id] += 1
        trial_dir = run.trials_dir / trial_name
        trial_dir.mkdir(parents=True)
        (trial_dir / "trial.log").write_text(f"try {calls[row.id]}\n")
        base = base_result(row, index, backend).model_copy(update={"trial_name": trial_name, "trial_dir": str(trial_dir)})
        if row.id == "flaky" and calls[row.id] > 1:
            return base.model_copy(update={"status": "success", "reward": 1.0, "err_phase": None})
        if row.id == "verifier":
            return base.model_copy(update={"err_category": "verifier_error", "err_phase": "verifier", "exception_type": "RewardFileNotFoundError",
                                           "failure_cause": "verifier_failed", "err_message": "no reward file", "verifier_mode": "separate"})  # fmt: skip
        return base.model_copy(update={"err_category": "timeout", "err_phase": "environment_setup", "exception_type": "EnvironmentStartTimeoutError",
                                       "failure_cause": "sandbox_failed", "err_message": "the sandbox did not start"})  # fmt: skip

    monkeypatch.setattr(prefect_harbor.tasks.trial, "run_row", run_row)
    backend = HarborBackend(
        tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), not_scored_retries=2, retry_wait_sec=0,
        cleanup_successful_trials=False,
    )  # fmt: skip
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": row_id, "metadata": {"harbor_task_id": "t"}}) + "\n" for row_id in ("flaky", "dead", "verifier")))

    summary = await evaluation_sweep(dataset=str(rows), backend=backend, results=str(tmp_path / "results"), prewarm=False)

    table = {r["row_id"]: r for r in pq.read_table(summary.results_uri).to_pylist()}
    assert dict(calls) == {"flaky": 2, "dead": 3, "verifier": 1}
    assert {row_id: (r["status"], r["tries"], scoring_of(r)) for row_id, r in table.items()} == {
        "flaky": ("success", 2, ("scored", None)), "dead": ("failure", 3, ("not_scored", "sandbox")), "verifier": ("failure", 1, ("not_scored", "verifier")),
    }  # fmt: skip
    for row_id, kept in (("flaky", 1), ("dead", 2)):
        trial = Path(table[row_id]["trial_dir"])
        assert (trial / "trial.log").read_text() == f"try {kept + 1}\n", "the row is the last try's"
        assert [(trial.parent / f"{trial.name}.try{n}" / "trial.log").read_text() for n in range(1, kept + 1)] == [f"try {n}\n" for n in range(1, kept + 1)]
    assert (summary.success, summary.failure, summary.mean_reward) == (1, 2, 1.0), "the not-scored rows are left out of the mean"
    async with get_client() as client:
        (run,) = [r for r in await client.read_flow_runs() if r.parameters.get("results") == str(tmp_path / "results")]
        logs = await logs_of(client, run.id)
    assert sum("Row dead: not scored (sandbox: the sandbox did not start); trying it again in 0 s" in line for line in logs) == 2
    assert any(line.startswith("Row dead (t): failure, timeout: the sandbox did not start after 3 tries;") for line in logs), logs


async def test_a_resumed_run_counts_its_kept_attempts_by_the_scoring_contract(tmp_path, monkeypatch):
    """The mean of a resumed run is over kept and new attempts alike: agent failures as 0, not scored left out
    (headline, summary.json, and the Harbor job's result.json)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run
    from prefect.states import Cancelling

    write_task(tmp_path / "tasks", "t")
    resumed = False

    async def run_row(row, index, trial_name, backend, resolver, run, *rest, **options):
        base = base_result(row, index, backend).model_copy(update={"trial_name": trial_name})
        if row.id == "agent-fails":
            return base.model_copy(update={"err_category": "agent_error", "err_phase": "agent", "exception_type": "NonZeroAgentExitCodeError",
                                           "err_message": "the agent exited 3"})  # fmt: skip
        if row.id == "sandbox-fails":
            return base.model_copy(update={"err_category": "timeout", "err_phase": "environment_setup", "exception_type": "EnvironmentStartTimeoutError",
                                           "failure_cause": "sandbox_failed", "err_message": "the sandbox did not start"})  # fmt: skip
        if row.id == "last" and not resumed:  # the first run is cancelled here
            async with get_client() as client:
                await client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            await asyncio.Event().wait()
        return base.model_copy(update={"status": "success", "reward": 1.0, "rewards": {"reward": 1.0}, "err_phase": None})

    monkeypatch.setattr(prefect_harbor.tasks.trial, "run_row", run_row)
    backend = HarborBackend(
        tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), n_concurrent=1, not_scored_retries=0
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": row_id, "metadata": {"harbor_task_id": "t"}}) + "\n" for row_id in ("ok", "agent-fails", "sandbox-fails", "last")))
    first = await evaluation_sweep(dataset=str(rows), backend=backend, results=str(tmp_path / "results"), prewarm=False, return_state=True)
    assert first.is_cancelled()
    (folder,) = [m.parent for m in (tmp_path / "results").glob("*/manifest.json")]

    resumed = True
    summary = await evaluation_sweep(dataset=str(rows), backend=backend, results=str(tmp_path / "results"), resume=str(folder), prewarm=False)

    assert (summary.rows, summary.scored, summary.agent_failures, summary.not_scored) == (4, 2, 1, {"sandbox": 1})
    assert summary.mean_reward == pytest.approx(2 / 3), "2 scored 1.0 and 1 agent failure as 0; the sandbox failure left out"
    assert "mean reward 0.667 over 3 rows, 1 agent failure counted as 0" in summary.headline() and "1 not scored (sandbox 1)" in summary.headline()
    written = json.loads((folder / "summary.json").read_text())
    assert written["statistics"]["reward"]["mean"] == pytest.approx(2 / 3) and written["statistics"]["not_scored"] == {"sandbox": 1}
    job = json.loads((folder / "result.json").read_text())
    (evals,) = job["stats"]["evals"].values()
    assert evals["metrics"][0]["mean"] == pytest.approx(2 / 3), "Harbor's viewer shows the same mean"
