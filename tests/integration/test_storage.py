"""Results and archives on real S3 servers: moto for most, SeaweedFS for auth and end to end."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import s3fs
from conftest import SEAWEED_KEY, SEAWEED_SECRET
from paths import EXAMPLE_DATASET, EXAMPLE_TASKS, EXPECTED_ORACLE_REWARDS
from tasks_factory import write_task

from prefect_harbor.blocks import HarborBackend, ResultsStorage
from prefect_harbor.config import ConfigurationError
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore

pytestmark = pytest.mark.integration


def row(index: int) -> RowResult:
    return RowResult(row_index=index, row_id=f"r{index}", task="t", status="success", reward=1.0)


def test_parts_on_s3_are_readable_mid_run_and_compacted_at_the_end(moto_bucket, tmp_path):
    url, options = moto_bucket
    store = RunStore(url, "run1", fallback_dir=tmp_path / "fallback", storage_options=options)
    store.check_writable()
    store.write_row(row(0))
    store.write_row(row(1))
    fs = s3fs.S3FileSystem(**options)
    assert pq.read_table(f"{url.removeprefix('s3://')}/run1/parts", filesystem=fs).num_rows == 2
    uri = store.finalize()
    assert uri == f"{url}/run1/results.parquet"
    fs.invalidate_cache()  # this reader listed the parts above; the store removed them since
    assert pq.read_table(uri.removeprefix("s3://"), filesystem=fs).column("row_id").to_pylist() == ["r0", "r1"]
    assert not fs.exists(f"{url}/run1/parts")


def test_a_storage_outage_keeps_rows_locally_and_says_where(moto_endpoint, tmp_path):
    """The server goes away mid-run: writes are retried, then kept locally; nothing is dropped."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    options = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://{host}:{port}"}, "skip_instance_cache": True}
    s3fs.S3FileSystem(**options).mkdir("outage")
    store = RunStore("s3://outage", "run1", fallback_dir=tmp_path / "fallback", storage_options=options, retry_delays=(0.05, 0.1))
    store.write_row(row(0))
    server.stop()
    store.write_row(row(1))
    assert store.unsent == ["parts/part-000001.parquet"]
    assert pq.read_table(tmp_path / "fallback" / "parts" / "part-000001.parquet").column("row_id").to_pylist() == ["r1"]
    location = store.finalize()
    assert location == str(tmp_path / "fallback" / "results.parquet")  # the storage is still down
    assert set(store.unsent) == {"parts/part-000001.parquet", "results.parquet"}
    assert pq.read_table(location).num_rows == 2


def test_wrong_credentials_are_a_configuration_error_before_any_trial(seaweedfs, tmp_path):
    # exist_ok: SeaweedFS keeps buckets on disk, and another test session on this machine may share its port.
    s3fs.S3FileSystem(key=SEAWEED_KEY, secret=SEAWEED_SECRET, client_kwargs={"endpoint_url": seaweedfs}, skip_instance_cache=True).makedirs("creds", exist_ok=True)
    bad = {"key": SEAWEED_KEY, "secret": "not-the-secret", "client_kwargs": {"endpoint_url": seaweedfs}, "skip_instance_cache": True}
    with pytest.raises(ConfigurationError, match="results storage s3://creds/run1 is not writable .*check the URL, the credentials"):
        RunStore("s3://creds", "run1", fallback_dir=tmp_path, storage_options=bad).check_writable()


@pytest.mark.usefixtures("prefect_server")
async def test_a_sweep_with_bad_storage_credentials_starts_no_trial(seaweedfs, tmp_path):
    await ResultsStorage(url="s3://creds2", endpoint_url=seaweedfs, access_key_id=SEAWEED_KEY, secret_access_key="wrong").save("bad-creds", overwrite=True)
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"))
    with pytest.raises(ConfigurationError, match="not writable"):
        await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend=backend, storage_block="bad-creds")
    assert not any((tmp_path / "trials").rglob("result.json")), "no trial may start"


@pytest.mark.usefixtures("prefect_server")
async def test_an_end_to_end_sweep_on_seaweedfs_is_read_back_by_another_process(seaweedfs, tmp_path):
    fs = s3fs.S3FileSystem(key=SEAWEED_KEY, secret=SEAWEED_SECRET, client_kwargs={"endpoint_url": seaweedfs}, skip_instance_cache=True)
    fs.makedirs("sweeps", exist_ok=True)  # a bucket left by an earlier run on the same server is fine: runs have folders of their own
    storage = ResultsStorage(url="s3://sweeps/evals", endpoint_url=seaweedfs, access_key_id=SEAWEED_KEY, secret_access_key=SEAWEED_SECRET)
    await storage.save("seaweed", overwrite=True)
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"))
    summary = await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend=backend, storage_block="seaweed")
    assert summary.results_uri.startswith("s3://sweeps/evals/") and summary.local_fallback is None

    reader = (
        "import json, sys, pyarrow.parquet as pq, s3fs\n"
        f"fs = s3fs.S3FileSystem(key={SEAWEED_KEY!r}, secret={SEAWEED_SECRET!r}, client_kwargs={{'endpoint_url': {seaweedfs!r}}})\n"
        "t = pq.read_table(sys.argv[1].removeprefix('s3://'), filesystem=fs)\n"
        "print(json.dumps({r['task']: r['reward'] for r in t.to_pylist()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", reader, summary.results_uri], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == EXPECTED_ORACLE_REWARDS

    run = summary.results_uri.removeprefix("s3://").rsplit("/", 1)[0]
    manifest = json.loads(fs.cat_file(f"{run}/manifest.json"))
    assert manifest["state"] == "Completed" and manifest["dataset"]["rows"] == len(EXPECTED_ORACLE_REWARDS)
    assert manifest["versions"]["harbor"].startswith("0.25")
    table = {r["row_id"]: r for r in pq.read_table(summary.results_uri.removeprefix("s3://"), filesystem=fs).to_pylist()}
    archive = {row_id: r["artifact_uri"].removeprefix("s3://") for row_id, r in table.items()}
    assert archive["reward-txt-1"] == f"{run}/{table['reward-txt-1']['trial_name']}", "an attempt's archive is its trial's folder"
    assert fs.exists(f"{archive['reward-txt-1']}/verifier/reward.txt")
    assert json.loads(fs.cat_file(f"{archive['broken-solution-1']}/diagnostics.json"))["status"] == "success"
    # The run's summary and its Harbor job files are in the bucket too.
    assert json.loads(fs.cat_file(f"{run}/summary.json"))["statistics"]["rows"] == len(EXPECTED_ORACLE_REWARDS)
    assert json.loads(fs.cat_file(f"{run}/result.json"))["n_total_trials"] == len(EXPECTED_ORACLE_REWARDS)
    assert json.loads(fs.cat_file(f"{run}/config.json"))["job_name"] == manifest["flow_run_name"], "the job is named as the Prefect run"
    assert manifest["flow_run_name"].startswith("oracle-dataset-"), "the run's name says the agent and the dataset"
    # Prefect's own task results went to the same storage, inside the run's folder: Harbor's viewer takes
    # every folder of the results root as a job, and lists none of theirs.
    assert fs.find(f"{run}/prefect-results"), "task results were not persisted to the storage block"
    assert not fs.exists(f"sweeps/evals/prefect-results/{summary.run_id}")

    # compare reads runs in object storage with the storage block's credentials, as status and cancel do.
    from typer.testing import CliRunner

    from prefect_harbor.cli.commands import app

    folder = summary.results_uri.rsplit("/", 1)[0]
    answer = await asyncio.to_thread(CliRunner().invoke, app, ["compare", folder, folder, "--storage-block", "seaweed", "--json"])
    assert answer.exit_code == 0, answer.output
    comparison = json.loads(answer.output)
    assert comparison["paired_rows"] == len(EXPECTED_ORACLE_REWARDS) and comparison["changed"] == []


def test_killing_the_flow_process_keeps_every_finished_row(tmp_path, prefect_server):
    # Against the session's Prefect server: on a temporary server of its own, the SIGKILLed CLI
    # would leave that server running (orphaned) for the rest of the session, after a ~20 s start.
    from prefect.settings import get_current_settings

    tasks = tmp_path / "tasks"
    for n in range(3):
        write_task(tasks, f"quick{n}")
    write_task(tasks, "slow", solve="bash -c 'sleep 600 & wait' prefect-harbor-kill-test")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": name, "metadata": {"harbor_task_id": name}}) + "\n" for name in ["slow", "quick0", "quick1", "quick2"]))
    results = tmp_path / "results"
    cli = str(Path(sys.executable).parent / "prefect-harbor")
    process = subprocess.Popen(
        [cli, "sweep", "--tasks-dir", str(tasks), "--dataset", str(dataset), "--results", str(results), "--concurrency", "4"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "cli.log", "wb"),
        env={**os.environ, "TMPDIR": str(tmp_path), "PREFECT_API_URL": str(get_current_settings().api.url)},
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while len(list(results.glob("*/parts/*.parquet"))) < 3:
        assert process.poll() is None, (tmp_path / "cli.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the quick rows did not finish"
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    (parts,) = results.glob("*/parts")
    table = pq.read_table(parts)
    assert sorted(table.column("row_id").to_pylist()) == ["quick0", "quick1", "quick2"]
    assert set(table.column("status").to_pylist()) == {"success"}
    # The owner's watchdog sees its pipe close and removes the container (about a second).
    deadline = time.monotonic() + 20
    while leftovers := [p for p in os.listdir("/proc") if p.isdigit() and b"prefect-harbor-kill-test" in _cmdline(p)]:
        assert time.monotonic() < deadline, f"the slow row's container outlived its owner: {leftovers}"
        time.sleep(0.2)


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.usefixtures("prefect_server")
async def test_no_archived_byte_holds_the_api_key(moto_bucket, tmp_path):
    url, options = moto_bucket
    key = "sk-prefect-harbor-test-5f2b8c"
    tasks = tmp_path / "tasks"
    write_task(tasks, "leaky", solve=f"echo 'calling the model with {key}'; echo '{key}' > /logs/artifacts/note.txt")
    write_task(tasks, "leaky-fails", solve=f"echo 'token={key}'", test=f"echo 'verifier saw {key}'")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": n, "metadata": {"harbor_task_id": n}}) + "\n" for n in ["leaky", "leaky-fails"]))
    storage = ResultsStorage(url=f"{url}/evals", endpoint_url=options["client_kwargs"]["endpoint_url"], access_key_id="k", secret_access_key="s")
    await storage.save("moto-key-scan", overwrite=True)
    backend = HarborBackend(
        tasks_dir=tasks, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), native_agent_kwargs={"api_key": key},
    )  # fmt: skip
    summary = await evaluation_sweep(dataset=str(dataset), backend=backend, storage_block="moto-key-scan")
    assert (summary.success, summary.failure) == (1, 1)

    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    objects = fs.find(f"{url}/evals")
    assert any(o.endswith("agent/oracle.txt") for o in objects) and any(o.endswith("config.json") for o in objects)
    leaks = [o for o in objects if key.encode() in fs.cat_file(o)]
    assert leaks == []
    assert any(b"[REDACTED]" in fs.cat_file(o) for o in objects if o.endswith("oracle.txt"))
    # The failed row's local trial directory is kept -- and scrubbed too.
    (trial_dir,) = [p for p in Path(tmp_path / "trials").glob("*/leaky-fails__*")]
    kept = [p for p in trial_dir.rglob("*") if p.is_file()]
    assert kept and not [p for p in kept if key.encode() in p.read_bytes()]


@pytest.mark.usefixtures("prefect_server")
async def test_a_sweep_outlives_its_storage_and_says_where_the_rows_are(tmp_path):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3fs.S3FileSystem(key="k", secret="s", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True).mkdir("flaky")
    await ResultsStorage(url="s3://flaky/evals", endpoint_url=endpoint, access_key_id="k", secret_access_key="s").save("flaky", overwrite=True)
    tasks = tmp_path / "tasks"
    write_task(tasks, "quick")
    write_task(tasks, "slower", solve="sleep 15")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": n, "metadata": {"harbor_task_id": n}}) + "\n" for n in ["quick", "slower"]))
    backend = HarborBackend(tasks_dir=tasks, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"))
    sweep = asyncio.create_task(evaluation_sweep(dataset=str(dataset), backend=backend, storage_block="flaky"))
    fs = s3fs.S3FileSystem(key="k", secret="s", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
    deadline = time.monotonic() + 60
    while not [p for p in fs.find("flaky/evals") if p.endswith("part-000000.parquet")]:
        assert time.monotonic() < deadline, "the quick row was never written"
        fs.invalidate_cache()
        await asyncio.sleep(0.2)
    server.stop()  # the storage goes away while the slower row is still running
    summary = await sweep
    assert (summary.success, summary.failure) == (2, 0), "trials must keep running without storage"
    fallback = Path(summary.local_fallback)
    assert {"parts/part-000001.parquet", "results.parquet", "manifest.json"} <= set(summary.unsent_files)
    assert summary.results_uri == str(fallback / "results.parquet")
    assert pq.read_table(summary.results_uri).num_rows == 2
    manifest = json.loads((fallback / "manifest.json").read_text())
    assert manifest["local_fallback"] == str(fallback) and "results.parquet" in manifest["unsent_files"]


def test_a_cut_part_on_s3_is_named_and_the_other_parts_read(moto_bucket, tmp_path):
    url, options = moto_bucket
    store = RunStore(url, "run1", fallback_dir=tmp_path / "fallback", storage_options=options)
    for index in range(3):
        store.write_row(row(index))
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    part = f"{url}/run1/parts/part-000001.parquet"
    fs.pipe_file(part, fs.cat_file(part)[:100])  # what an older version's crash mid-write left
    reader = RunStore(url, "run1", fallback_dir=tmp_path / "fallback2", storage_options=options)
    assert [r.row_id for r in reader.read_results()] == ["r0", "r2"]
    assert len(reader.damaged) == 1 and "part-000001.parquet is damaged" in reader.damaged[0]


def test_stale_runs_are_found_on_s3(moto_bucket, tmp_path):
    from datetime import UTC, datetime, timedelta

    from prefect_harbor.storage.control import HEARTBEAT_FILE, STALE_AFTER_SECONDS, Heartbeat, find_stale_runs
    from prefect_harbor.storage.run_store import RunManifest

    url, options = moto_bucket
    for name, age in [("dead", STALE_AFTER_SECONDS + 5), ("alive", 0)]:
        store = RunStore(f"{url}/evals", name, fallback_dir=tmp_path / name, storage_options=options)
        beat = Heartbeat.now(None)
        beat = beat.model_copy(update={"at": beat.at - timedelta(seconds=age), "host": "another-machine" if age else beat.host})
        store.write_now(HEARTBEAT_FILE, beat.model_dump_json().encode())
        store.write_manifest(RunManifest(run_id=name, state="Running", started_at=datetime.now(UTC), dataset={}, configuration={}, versions={}))
    (stale,) = find_stale_runs(f"{url}/evals", options)
    assert stale.store.run_id == "dead" and "from process" in stale.reason and "on another-machine" in stale.reason


def test_compare_reads_two_runs_in_object_storage_by_url(moto_bucket, tmp_path, monkeypatch):
    """``compare s3://… s3://…`` with the environment's AWS settings, as a CI job would give them."""
    from typer.testing import CliRunner

    from prefect_harbor.cli.commands import app

    url, options = moto_bucket
    for run_id, rewards in (("before", (1.0, 1.0)), ("after", (1.0, 0.0))):
        store = RunStore(url, run_id, fallback_dir=tmp_path / run_id, storage_options=options)
        store.write_rows([row(index).model_copy(update={"reward": reward}) for index, reward in enumerate(rewards)])
        store.finalize()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["client_kwargs"]["endpoint_url"])
    s3fs.S3FileSystem.clear_instance_cache()
    answer = CliRunner().invoke(app, ["compare", f"{url}/before", f"{url}/after", "--json"])
    assert answer.exit_code == 0, answer.output
    comparison = json.loads(answer.output)
    assert comparison["paired_rows"] == 2 and [change["row_id"] for change in comparison["changed"]] == ["r1"]
    assert comparison["difference"]["difference"]["mean"] == -0.5
