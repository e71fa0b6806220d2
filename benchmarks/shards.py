"""One sweep on two hosts (``shards=2``) against the same sweep on one host: same rows, same trials at once.

    .venv/bin/python benchmarks/shards.py                  # ~4 minutes
    .venv/bin/python benchmarks/shards.py --rows 40 --per-host 2

Starts ``prefect server start`` and moto's S3 server, deploys ``deployments/prefect.yaml``
(the ``sweep-shard/shard`` deployment with it), and two process workers as two hosts would run
them (own working directory, Prefect home and ``PREFECT_HARBOR_HOST``, ``--limit 1``), on this
machine's podman. Then, in this process, two sweeps of the same ``--rows`` oracle rows of the
example tasks into the same S3 bucket:

- ``one host``: ``evaluation_sweep(shards=1)``, ``2 × per-host`` trials at once, in this process;
- ``two hosts``: ``evaluation_sweep(shards=2)``, ``per-host`` trials at once on each worker.

It prints each sweep's wall time and the server's CPU, and their ratio and the difference per
row: the orchestration cost of the shard path (a worker's poll, a flow-run process per shard,
its own prewarm). Both hosts share this machine's cores, so the trials themselves do not get
faster: this measures cost, not speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from sweep_overhead import TASKS, write_dataset  # noqa: E402
from sweep_vs_harbor import prefect_server, session_cpu  # noqa: E402

HOSTS = ("host-1", "host-2")
BUCKET = "shards-bench"


def start_worker(scratch: Path, host: str, env: dict[str, str]) -> subprocess.Popen:
    home = scratch / host
    (home / "prefect").mkdir(parents=True)
    env = {**env, "PREFECT_HOME": str(home / "prefect"), "PREFECT_HARBOR_HOST": host, "TMPDIR": str(home)}
    argv = [str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool", "harbor-process", "--limit", "1", "--name", host]
    return subprocess.Popen(argv, env=env, cwd=home, stdout=open(home / "worker.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)


async def sweep(dataset: Path, shards: int) -> tuple[float, dict]:
    from prefect_harbor.flows import evaluation_sweep

    began = time.perf_counter()
    state = await evaluation_sweep(dataset=str(dataset), backend_block=f"bench-{shards}", storage_block="bench-s3", shards=shards, return_state=True)
    summary = await state.aresult(raise_on_failure=False)
    return time.perf_counter() - began, summary.model_dump(include={"rows", "success", "failure", "cancelled"})


async def measure(args: argparse.Namespace, scratch: Path, server_pid: int) -> dict:
    from prefect_harbor.blocks import HarborBackend

    for shards, at_once in ((1, 2 * args.per_host), (2, args.per_host)):
        backend = HarborBackend(tasks_dir=TASKS, task_mode="dataset", agent="oracle", n_concurrent=at_once, trials_dir=str(scratch / "trials"))
        await backend.save(f"bench-{shards}", overwrite=True)
    dataset = write_dataset(scratch / "rows.jsonl", args.rows)
    figures = {}
    for name, shards in (("one host", 1), ("two hosts", 2)):
        cpu = session_cpu(server_pid)
        wall, counts = await sweep(dataset, shards)
        figures[name] = {"wall_s": round(wall, 2), "server_cpu_ms_per_row": round(1000 * (session_cpu(server_pid) - cpu) / args.rows, 1), **counts}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--per-host", type=int, default=2, help="trials at once on each host (twice this on the one host)")
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    scratch = Path(tempfile.mkdtemp(prefix="shards-bench-"))
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    s3.start()
    endpoint = "http://{}:{}".format(*s3.get_host_and_port())
    with prefect_server(scratch / "server", scratch / "server.log") as (api, server_pid):
        env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_WORKER_QUERY_SECONDS": "1", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
        os.environ.update(PREFECT_API_URL=api)
        prefect = str(Path(sys.executable).parent / "prefect")
        subprocess.run([prefect, "work-pool", "create", "harbor-process", "--type", "process", "--overwrite"], env=env, check=True, capture_output=True)
        subprocess.run([prefect, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all"], env=env, cwd=REPO, check=True, capture_output=True)
        import s3fs

        s3fs.S3FileSystem(key="k", secret="s", client_kwargs={"endpoint_url": endpoint}).mkdir(BUCKET)
        from prefect_harbor.blocks import ResultsStorage

        ResultsStorage(url=f"s3://{BUCKET}/evals", endpoint_url=endpoint, access_key_id="k", secret_access_key="s").save("bench-s3", overwrite=True)
        workers = [start_worker(scratch, host, env) for host in HOSTS]
        try:
            figures = asyncio.run(measure(args, scratch, server_pid))
        finally:
            for worker in workers:
                worker.terminate()
    s3.stop()
    one, two = figures["one host"], figures["two hosts"]
    for name, x in figures.items():
        print(f"{name:10s} wall {x['wall_s']:7.2f} s  server CPU {x['server_cpu_ms_per_row']:6.1f} ms/row  rows {x['rows']} ({x['success']} success, {x['failure']} failure)")
    print(f"ratio two/one {two['wall_s'] / one['wall_s']:.2f}  shard cost {1000 * (two['wall_s'] - one['wall_s']) / args.rows:.0f} ms/row of wall")
    print(json.dumps({"rows": args.rows, "per_host": args.per_host, **figures}))


if __name__ == "__main__":
    main()
