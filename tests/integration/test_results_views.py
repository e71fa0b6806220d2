"""A results root read the ways evaluators read it: `prefect-harbor compare` on two real runs, and Harbor's own viewer (`harbor view`) over them.

Three real sweeps under one root: A (CLI, --attempts 2), B (the same rows with one task
broken, attempts 2), C (terminus-2 against the scripted model, so tokens are reported).
"""

import contextlib
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from deployment_helpers import HTTP
from paths import EXAMPLE_TASKS, REPO
from pydantic import SecretStr
from tasks_factory import write_task

from prefect_harbor.blocks import HarborBackend, ModelEndpoint
from prefect_harbor.testing.model_server import ScriptedModelServer

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

BIN = Path(sys.executable).parent


@dataclass
class Runs:
    root: Path
    a: Path
    b: Path
    c: Path


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "prefect-harbor"), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    import asyncio

    from prefect_harbor.flows import evaluation_sweep

    work = tmp_path_factory.mktemp("views")
    root = work / "results"
    for variant, flips in (("tasks-a", "echo 1 > /logs/verifier/reward.txt"), ("tasks-b", "echo 0 > /logs/verifier/reward.txt")):
        write_task(work / variant, "steady")
        write_task(work / variant, "flips", test=flips)
    dataset = work / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": i, "metadata": {"harbor_task_id": t}}) + "\n" for i, t in [("s1", "steady"), ("f1", "flips"), ("f2", "flips")]))

    a = cli("sweep", "--tasks-dir", str(work / "tasks-a"), "--dataset", str(dataset), "--results", str(root), "--attempts", "2", "--concurrency", "3", "--json")
    assert a.returncode == 0, a.stderr[-3000:]
    a_summary = json.loads(a.stdout)
    assert a_summary["attempts"] == 2 and a_summary["statistics"]["trials"] == 6 and a_summary["statistics"]["pass_at_k"] == {"1": 1.0, "2": 1.0}

    backend_b = HarborBackend(tasks_dir=work / "tasks-b", task_mode="dataset", agent="oracle", trials_dir=str(work / "trials"), n_concurrent=3, attempts=2)
    b = asyncio.run(evaluation_sweep(dataset=str(dataset), backend=backend_b, results=str(root)))

    words = work / "words.jsonl"
    words.write_text(json.dumps({"id": "w", "metadata": {"harbor_task_id": "reward-txt"}}) + "\n")
    with ScriptedModelServer(REPO / "examples" / "model-scripts" / "terminus-2-reward-txt.json", api_key="sk-views-test-key") as server:
        endpoint = ModelEndpoint(base_url=server.base_url, api_key=SecretStr("sk-views-test-key"))
        backend_c = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="terminus-2", model_name="scripted", model_endpoint=endpoint, trials_dir=str(work / "trials"))
        c = asyncio.run(evaluation_sweep(dataset=str(words), backend=backend_c, results=str(root)))
    assert c.success == 1, c.headline()
    folder = lambda uri: Path(uri.removeprefix("file://")).parent  # noqa: E731
    return Runs(root, folder(a_summary["results_uri"]), folder(b.results_uri), folder(c.results_uri))


def test_compare_names_the_task_that_got_worse_and_its_rows(runs):
    answer = cli("compare", str(runs.a), str(runs.b), "--json")
    assert answer.returncode == 0, answer.stderr
    comparison = json.loads(answer.stdout)
    assert comparison["paired_rows"] == 3
    assert comparison["difference"]["difference"]["mean"] == pytest.approx(-2 / 3)
    assert comparison["per_task"]["flips"]["difference"]["mean"] == -1.0 and comparison["per_task"]["flips"]["rows"] == 2
    assert comparison["per_task"]["steady"]["difference"]["mean"] == 0.0
    assert [c["row_id"] for c in comparison["changed"]] == ["f1", "f2"]
    assert comparison["changed"][0]["baseline"] == {"task": "flips", "mean": 1.0, "ended": "2 success"}
    assert comparison["changed"][0]["candidate"] == {"task": "flips", "mean": 0.0, "ended": "2 success"}

    text = cli("compare", str(runs.a), str(runs.b))
    # Two rows that went 1 -> 0: McNemar's p is 0.5, Holm-adjusted over the two tasks 1; lower, not worse beyond chance.
    assert text.returncode == 0 and "1 task lower than run '" in text.stdout and "flips −1 (p=1, could be chance)" in text.stdout, text.stdout
    assert cli("compare", str(runs.a), str(runs.b), "--fail-on-regression").returncode == 0

    assert cli("compare", str(runs.a), str(runs.b), "--fail-if-worse", "0.5").returncode == 1
    assert cli("compare", str(runs.a), str(runs.b), "--fail-if-worse", "0.7").returncode == 0
    assert cli("compare", str(runs.b), str(runs.a), "--fail-if-worse", "0").returncode == 0, "better is never worse"


def free_port() -> int:
    with contextlib.closing(socket.socket()) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def viewer(runs) -> str:
    """`harbor view <results root>`, Harbor's own command, serving its API: its base URL."""
    port = free_port()
    log = runs.root.parent / "viewer.log"
    process = subprocess.Popen([str(BIN / "harbor"), "view", str(runs.root), "--port", str(port), "--no-build"], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if HTTP.get(f"{base}/api/health", timeout=2).status_code == 200:
                    break
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_harbor_view_shows_each_sweep_as_a_job_with_its_trials_rewards_and_tokens(runs, viewer):
    jobs = {job["name"]: job for job in HTTP.get(f"{viewer}/api/jobs", timeout=30).json()["items"]}
    assert set(jobs) == {runs.a.name, runs.b.name, runs.c.name}
    a, c = jobs[runs.a.name], jobs[runs.c.name]
    assert (a["n_total_trials"], a["n_completed_trials"], a["n_errored_trials"], a["agents"]) == (6, 6, 0, ["oracle"])
    assert a["evals"] == {"oracle__adhoc": {"metrics": [{"mean": 1.0}]}} and a["finished_at"] is not None
    assert jobs[runs.b.name]["evals"]["oracle__adhoc"]["metrics"] == [{"mean": pytest.approx(1 / 3)}]
    assert (c["agents"], c["models"], c["n_total_trials"]) == (["terminus-2"], ["scripted"], 1)
    assert c["total_input_tokens"] is not None and c["total_output_tokens"] > 0

    trials = HTTP.get(f"{viewer}/api/jobs/{runs.a.name}/trials", timeout=30).json()
    assert trials["total"] == 6
    assert sorted((t["name"].split("__")[0], t["reward"]) for t in trials["items"]) == [
        ("f1", 1.0), ("f1.a2", 1.0), ("f2", 1.0), ("f2.a2", 1.0), ("s1", 1.0), ("s1.a2", 1.0),
    ]  # fmt: skip
    assert {t["agent_name"] for t in trials["items"]} == {"oracle"}
    (trial,) = HTTP.get(f"{viewer}/api/jobs/{runs.c.name}/trials", timeout=30).json()["items"]
    assert trial["reward"] == 1.0 and trial["model_name"] == "scripted" and trial["output_tokens"] > 0 and trial["input_tokens"] is not None
    # A trial's own pages read the archive: the verifier's output, as the viewer shows it.
    output = HTTP.get(f"{viewer}/api/jobs/{runs.a.name}/trials/{trials['items'][0]['name']}/verifier-output", timeout=30).json()
    assert output["stdout"] is not None or output["reward"] is not None
    # The trial's page points at its archive (the successful trial's local folder is gone), and the job is named as the Prefect run.
    name = trials["items"][0]["name"]
    assert HTTP.get(f"{viewer}/api/jobs/{runs.a.name}/trials/{name}", timeout=30).json()["trial_uri"] == (runs.a / name).as_uri()
    manifest = json.loads((runs.a / "manifest.json").read_text())
    assert HTTP.get(f"{viewer}/api/jobs/{runs.a.name}/config", timeout=30).json()["job_name"] == manifest["flow_run_name"]


def test_a_run_from_before_attempts_still_compares(runs, tmp_path):
    """A results table without the attempt column (runs of earlier versions): one attempt per row, paired by row id."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    old = tmp_path / "old" / "20260101T000000Z-0ld0ld00"
    old.mkdir(parents=True)
    table = pq.read_table(runs.a / "results.parquet")
    pq.write_table(table.filter(pc.equal(table["attempt"], 1)).drop_columns(["attempt"]), old / "results.parquet")
    comparison = json.loads(cli("compare", str(old), str(runs.b), "--json").stdout)
    assert comparison["paired_rows"] == 3 and comparison["per_task"]["flips"]["difference"]["mean"] == -1.0
