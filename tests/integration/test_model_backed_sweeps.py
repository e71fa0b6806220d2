"""Model-backed native agents through the whole sweep: endpoint block wiring, rewards, and no key anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from harbor.utils.env import redact_sensitive_value
from paths import EXAMPLE_TASKS, REPO

from prefect_harbor.blocks import HarborBackend, ModelEndpoint
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.testing.model_server import ScriptedModelServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(300)]

API_KEY = "sk-sweep-scan-51c0ffee9d"


def every_file_holding(root: Path, *needles: str) -> list[str]:
    """Every file under ``root`` holding any of ``needles`` (the whole tree, every byte)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and any(n.encode() in p.read_bytes() for n in needles)]


@pytest.mark.parametrize("agent", ["terminus-2", pytest.param("mini-swe-agent", marks=pytest.mark.slow)])
async def test_a_native_agent_sweep_scores_and_keeps_no_key(tmp_path, agent):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"id": "words", "metadata": {"harbor_task_id": "reward-txt"}}) + "\n")
    script = REPO / "examples" / "model-scripts" / f"{agent}-reward-txt.json"
    with ScriptedModelServer(script, api_key=API_KEY) as server:
        backend = HarborBackend(
            tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent=agent, model_name="scripted", cleanup_successful_trials=False,
            model_endpoint=ModelEndpoint(base_url=server.base_url, api_key=API_KEY), trials_dir=str(tmp_path / "trials"),
        )  # fmt: skip
        summary = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"))
        assert server.completions and all(r.authorized for r in server.completions)

    (row,) = pq.read_table(summary.results_uri).to_pylist()
    assert (row["status"], row["reward"], row["model"]) == ("success", 1.0, "scripted")
    # Neither the key nor Harbor's masked form of it, in any byte the sweep kept.
    assert every_file_holding(tmp_path / "results", API_KEY, redact_sensitive_value(API_KEY)) == []
    assert every_file_holding(tmp_path / "trials", API_KEY, redact_sensitive_value(API_KEY)) == []
