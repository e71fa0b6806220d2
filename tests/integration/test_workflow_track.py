"""The Osmosis workflow track end to end: an unmodified v0.3 project, bundled, run and graded in real sandboxes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from paths import OSMOSIS_EXAMPLE, OSMOSIS_PROJECT, REPO

from prefect_harbor.blocks import HarborBackend, ModelEndpoint
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.testing.model_server import ScriptedModelServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

EDGE_PROJECT = REPO / "tests" / "fixtures" / "edge-agent"
API_KEY = "sk-workflow-track-7f3a9c1e"
EXAMPLE = {
    "agent": "arithmetic_agent.workflow:ArithmeticWorkflow",
    "grader": "arithmetic_agent.grader:ExactMatchGrader",
    "workflow_config": "arithmetic_agent.config:workflow_config",
    "grader_config": "arithmetic_agent.config:grader_config",
    "code_dir": OSMOSIS_PROJECT,
}


@pytest.fixture(scope="module")
def model_server():
    with ScriptedModelServer(OSMOSIS_EXAMPLE / "model-script.json", api_key=API_KEY) as server:
        yield server


@pytest.fixture(autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One bundle cache for this module: builds are tested once, then reused."""
    cache = tmp_path_factory.getbasetemp() / "bundle-cache"
    monkeypatch.setenv("PREFECT_HARBOR_CACHE", str(cache))
    return cache


def backend(tmp_path: Path, tasks_dir: Path, endpoint: ModelEndpoint | None = None, **kwargs) -> HarborBackend:
    options = {**EXAMPLE, **kwargs}
    return HarborBackend(tasks_dir=tasks_dir, trials_dir=str(tmp_path / "trials"), model_endpoint=endpoint, cleanup_successful_trials=False, **options)


def endpoint_of(server: ScriptedModelServer) -> ModelEndpoint:
    return ModelEndpoint(base_url=server.base_url, api_key=API_KEY)


async def sweep(tmp_path: Path, dataset: Path, config: HarborBackend) -> list[dict]:
    summary = await evaluation_sweep(dataset=str(dataset), backend=config, results=str(tmp_path / "results"))
    return pq.read_table(summary.results_uri).to_pylist()


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle.encode() in p.read_bytes()]


async def test_template_mode_runs_and_grades_the_example_project_and_leaks_no_key(tmp_path, model_server):
    rows = await sweep(tmp_path, OSMOSIS_EXAMPLE / "dataset.jsonl", backend(tmp_path, OSMOSIS_EXAMPLE / "template", endpoint_of(model_server)))

    assert {r["row_id"]: (r["status"], r["reward"]) for r in rows} == {"sum-1": ("success", 1.0), "sum-2": ("success", 1.0), "product-1": ("success", 1.0)}
    sum_1 = next(r for r in rows if r["row_id"] == "sum-1")
    assert json.loads(sum_1["final_messages"])[-1] == {"role": "assistant", "content": "5"}
    # The workflow called the model through the endpoint it was given, with the key.
    assert len(model_server.completions) >= 3 and all(r.authorized and r.status == 200 for r in model_server.completions)
    # The agent never saw the label; the grader did (it scored 1.0 against it).
    trial = next((tmp_path / "trials").glob("*/sum-1__*"))
    assert json.loads((trial / "agent" / "container_input.json").read_text())["label"] is None
    # Not a byte of the key in the results, the archives, or the kept trial trees.
    assert files_containing(tmp_path / "results", API_KEY) == []
    assert files_containing(tmp_path / "trials", API_KEY) == []


async def test_dataset_mode_gives_the_workflow_the_task_instruction(tmp_path, model_server):
    config = backend(tmp_path, OSMOSIS_EXAMPLE / "tasks", endpoint_of(model_server), task_mode="dataset")
    rows = await sweep(tmp_path, OSMOSIS_EXAMPLE / "dataset-tasks.jsonl", config)

    assert {r["row_id"]: (r["task"], r["status"], r["reward"]) for r in rows} == {
        "addition": ("addition", "success", 1.0),
        "multiplication": ("multiplication", "success", 1.0),
    }
    first = json.loads(next(r for r in rows if r["row_id"] == "addition")["final_messages"])[0]
    assert first["role"] == "user" and "What is 17 + 25?" in first["content"]


async def test_a_second_sweep_reuses_the_cached_bundle(tmp_path, model_server, shared_cache):
    config = backend(tmp_path, OSMOSIS_EXAMPLE / "template", endpoint_of(model_server))
    await sweep(tmp_path / "first", OSMOSIS_EXAMPLE / "dataset.jsonl", config)
    wheels = sorted((shared_cache / "bundles").glob("*/*.whl"))
    built = {w: w.stat().st_mtime_ns for w in wheels}
    await sweep(tmp_path / "second", OSMOSIS_EXAMPLE / "dataset.jsonl", config)
    assert {w: w.stat().st_mtime_ns for w in sorted((shared_cache / "bundles").glob("*/*.whl"))} == built


def edge(tmp_path: Path, agent: str, grader: str | None, tasks_dir: Path = OSMOSIS_EXAMPLE / "template") -> HarborBackend:
    return backend(tmp_path, tasks_dir, agent=agent, grader=grader, code_dir=EDGE_PROJECT, workflow_config=None, grader_config=None)


async def test_a_task_test_sh_wins_over_the_grader(tmp_path):
    task = Path(shutil.copytree(OSMOSIS_EXAMPLE / "template", tmp_path / "task"))
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 0.25 > /logs/verifier/reward.txt\n")
    rows = await sweep(tmp_path, OSMOSIS_EXAMPLE / "dataset.jsonl", edge(tmp_path, "edge_agent.workflows:AnswerFiveWorkflow", "edge_agent.graders:LabelGrader", task))
    assert {r["reward"] for r in rows} == {0.25}


async def test_a_workflow_that_leaves_no_sample_has_nothing_to_grade(tmp_path):
    rows = await sweep(tmp_path, OSMOSIS_EXAMPLE / "dataset.jsonl", edge(tmp_path, "edge_agent.workflows:SilentWorkflow", "edge_agent.graders:LabelGrader"))
    assert {(r["status"], r["err_category"], r["reward"]) for r in rows} == {("failure", "validation_error", None)}
    assert all(r["err_message"].startswith("No sample to grade") for r in rows)


async def test_a_grader_that_sets_no_reward_fails_the_row(tmp_path):
    rows = await sweep(tmp_path, OSMOSIS_EXAMPLE / "dataset.jsonl", edge(tmp_path, "edge_agent.workflows:AnswerFiveWorkflow", "edge_agent.graders:ForgetfulGrader"))
    assert {(r["status"], r["err_category"], r["err_phase"]) for r in rows} == {("failure", "validation_error", "grading")}
    assert all("Sample has no reward after grading" in r["err_message"] for r in rows)


async def test_a_workflow_exception_is_a_failure_row_with_its_message(tmp_path):
    rows = await sweep(tmp_path, OSMOSIS_EXAMPLE / "dataset.jsonl", edge(tmp_path, "edge_agent.workflows:FailingWorkflow", "edge_agent.graders:LabelGrader"))
    assert {(r["status"], r["err_category"], r["err_message"]) for r in rows} == {("failure", "agent_error", "the workflow's tool crashed")}


async def test_an_unimportable_workflow_config_fails_before_any_trial(tmp_path):
    config = backend(tmp_path, OSMOSIS_EXAMPLE / "template", workflow_config="arithmetic_agent.config:no_such_config")
    with pytest.raises(Exception, match="workflow_config: 'arithmetic_agent.config:no_such_config' cannot be imported"):
        await sweep(tmp_path, OSMOSIS_EXAMPLE / "dataset.jsonl", config)
    assert not (tmp_path / "trials").exists()
