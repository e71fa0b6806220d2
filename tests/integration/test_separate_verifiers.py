"""Harbor 0.25's separate verifiers through the real sweep: the verifier in a container of its own,
built from tests/Dockerfile (or a fresh copy of the task's environment), seeing only the declared
artifacts; pod tasks with sidecar artifacts and collect hooks too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tasks_factory import VERIFIER_DOCKERFILE, write_multi_step_task, write_separate_verifier_task

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

#: task -> (how it is written, the reward its oracle earns)
TASKS = {
    "own-image-right": ({"word": "CORRECT"}, 1.0),
    "own-image-wrong": ({"word": "WRONG"}, 0.0),
    "pod-right": ({"word": "CORRECT", "store": True}, 1.0),
    "pod-wrong": ({"word": "WRONG", "store": True}, 0.0),
    "fresh-copy-right": ({"word": "CORRECT", "own_image": False}, 1.0),
}


def sweep(tmp_path: Path, tasks: Path, task_ids: list[str]) -> dict[str, dict]:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": task, "metadata": {"harbor_task_id": task}}) + "\n" for task in task_ids))
    backend = HarborBackend(tasks_dir=tasks, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), cleanup_successful_trials=False)
    summary = asyncio.run(evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"), concurrency=2))
    return {row["row_id"]: row for row in pq.read_table(summary.results_uri).to_pylist()}


def write_steps_task(root: Path) -> None:
    """Two steps: the first verified separately (its own tests/Dockerfile, its own artifact), the second shared."""
    task = write_multi_step_task(root, "steps", {
        "one": ("echo one > /app/one.txt", "[ \"$(cat /app/one.txt)\" = one ] && [ ! -e /app/two.txt ] && echo 1 > /logs/verifier/reward.txt || echo 0 > "
            "/logs/verifier/reward.txt"),
        "two": ("echo two > /app/two.txt", "[ -e /app/one.txt ] && [ -e /app/two.txt ] && echo 0.5 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"),
    })  # fmt: skip
    toml = (task / "task.toml").read_text().replace('name = "one"\n', 'name = "one"\nartifacts = ["/app/one.txt"]\n[steps.verifier]\nenvironment_mode = "separate"\n')
    (task / "task.toml").write_text(toml)
    (task / "steps" / "one" / "tests" / "Dockerfile").write_text(VERIFIER_DOCKERFILE)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    tmp_path = tmp_path_factory.mktemp("separate")
    for name, (options, _) in TASKS.items():
        write_separate_verifier_task(tmp_path / "tasks", name, **options)
    write_steps_task(tmp_path / "tasks")
    return tmp_path, sweep(tmp_path, tmp_path / "tasks", [*TASKS, "steps"])


@pytest.mark.parametrize("task", TASKS)
def test_a_separate_verifier_scores_the_declared_artifact(swept, task):
    """1.0 for the right artifact, 0 for a wrong one; and 1.0 only when the verifier saw neither the
    agent's undeclared file nor the process it left running."""
    _, rows = swept
    row = rows[task]
    assert (row["status"], row["reward"]) == ("success", TASKS[task][1]), row["err_message"]


def test_a_steps_own_separate_verifier_scores_it_and_the_next_step_goes_on_in_the_agents_container(swept):
    _, rows = swept
    assert (rows["steps"]["status"], rows["steps"]["reward"]) == ("success", 0.75), rows["steps"]["err_message"]


def test_artifacts_reach_the_verifier_through_the_host_with_main_stopped_before_sidecar_evidence(swept):
    """The artifacts went through the host (the trial's artifacts/ folder and its manifest); the
    store's state was exported by the collect hook once main, and what the agent left running, was stopped."""
    tmp_path, _ = swept
    (trial,) = [folder for folder in (tmp_path / "trials").rglob("pod-right__*") if (folder / "trial.log").is_file()]
    manifest = {entry["source"]: entry for entry in json.loads((trial / "artifacts" / "manifest.json").read_text())}
    assert manifest["/app/words.txt"]["status"] == "ok" and manifest["/export/value.txt"]["service"] == "store"
    assert (trial / "artifacts" / "export" / "value.txt").read_text().strip() == "CORRECT"
    log = (trial / "trial.log").read_text()
    assert log.index("Stopping main service before sidecar evidence collection") < log.index("Running collect hook in service 'store'")


def test_a_verifier_image_that_cannot_be_built_fails_its_rows_in_prewarm_before_any_agent_runs(tmp_path):
    task = write_separate_verifier_task(tmp_path / "tasks", "broken-verifier", word="CORRECT")
    (task / "tests" / "Dockerfile").write_text("FROM debian:bookworm-slim\nRUN echo the-verifier-build-breaks && exit 3\n")
    (row,) = sweep(tmp_path, tmp_path / "tasks", ["broken-verifier"]).values()
    assert (row["status"], row["err_category"], row["err_phase"]) == ("failure", "validation_error", "setup")
    assert "failed prewarm: image build failed" in row["err_message"] and "tests/Dockerfile" in row["err_message"], row["err_message"]
    assert row["total_sec"] is None, "a trial ran although its verifier could not be built"
