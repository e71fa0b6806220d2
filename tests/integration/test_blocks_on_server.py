"""The blocks on a real Prefect server: registration, save/load, and a sweep by block name."""

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from paths import EXAMPLE_DATASET, EXAMPLE_TASKS, EXPECTED_ORACLE_REWARDS
from prefect.client.orchestration import get_client
from prefect.settings import get_current_settings
from tasks_factory import git_task_repo

from prefect_harbor.blocks import HarborBackend, ModelEndpoint
from prefect_harbor.config import ConfigurationError, TaskSourcePolicy
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.flows.sweep import resolve_backend

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


def test_the_collection_entry_point_names_the_blocks_module():
    (entry,) = [e for e in entry_points(group="prefect.collections") if e.name == "prefect_harbor"]
    assert entry.value == "prefect_harbor.blocks"


async def test_prefect_block_register_registers_all_three_block_types():
    env = {**os.environ, "PREFECT_API_URL": str(get_current_settings().api.url)}
    prefect = str(Path(sys.executable).parent / "prefect")
    result = subprocess.run([prefect, "block", "register", "-m", "prefect_harbor.blocks"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    async with get_client() as client:
        slugs = {block_type.slug for block_type in await client.read_block_types()}
    assert {"harbor-backend", "model-endpoint", "results-storage"} <= slugs


async def test_saved_secrets_stay_masked_on_the_server():
    await ModelEndpoint(base_url="http://127.0.0.1:9/v1", api_key="sk-never-shown").save("test-endpoint", overwrite=True)
    async with get_client() as client:
        document = await client.read_block_document_by_name("test-endpoint", "model-endpoint", include_secrets=False)
    assert "sk-never-shown" not in json.dumps(document.data, default=str)
    loaded = await ModelEndpoint.aload("test-endpoint")
    assert loaded.api_key.get_secret_value() == "sk-never-shown"


async def test_a_sweep_takes_its_configuration_by_block_name(tmp_path):
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), n_concurrent=2)
    await backend.save("examples-oracle", overwrite=True)
    summary = await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend_block="examples-oracle", results=str(tmp_path / "results"))
    assert summary.rows == summary.success == len(EXPECTED_ORACLE_REWARDS)


async def test_a_saved_block_that_no_longer_validates_fails_before_any_trial(tmp_path):
    tasks = tmp_path / "tasks"
    (tasks / "t").mkdir(parents=True)
    (tasks / "t" / "task.toml").write_text("")
    (tasks / "t" / "tests").mkdir()
    (tasks / "t" / "tests" / "test.sh").write_text("")
    await HarborBackend(tasks_dir=tasks, task_mode="dataset", agent="oracle").save("soon-broken", overwrite=True)
    (tasks / "t" / "tests" / "test.sh").unlink()
    with pytest.raises(ConfigurationError, match="soon-broken. is not a valid Harbor Backend block: .*no reward source.*edit it"):
        await resolve_backend(None, "soon-broken")
    with pytest.raises(ConfigurationError, match="exactly one"):
        await resolve_backend(None, None)


async def test_a_git_sourced_row_runs_in_a_sweep(tmp_path):
    url, commit = git_task_repo(tmp_path / "repo", EXAMPLE_TASKS / "reward-txt")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(
        json.dumps({"id": "from-git", "metadata": {"harbor_task": "tasks/hello", "git_url": url, "git_commit_id": commit}}) + "\n"
        + json.dumps({"id": "refused", "metadata": {"harbor_task": "tasks/hello", "git_url": "https://example.invalid/x.git", "git_commit_id": commit}}) + "\n"
    )  # fmt: skip
    backend = HarborBackend(
        tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"),
        task_sources=TaskSourcePolicy(allowed_git_url_prefixes=[url]),
    )  # fmt: skip
    summary = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"))
    rows = {r["row_id"]: r for r in pq.read_table(summary.results_uri).to_pylist()}
    assert (rows["from-git"]["status"], rows["from-git"]["task"], rows["from-git"]["reward"]) == ("success", "hello", 1.0)
    assert rows["refused"]["status"] == "failure" and "allowed_git_url_prefixes" in rows["refused"]["err_message"]
