"""What the size of podman's image store costs every podman call: this host's store against an empty one.

    .venv/bin/python benchmarks/image_store.py [--calls 40] [--rounds 3]

Every podman invocation reads its whole store (``images.json``, ``layers.json``) before it does
anything, and a trial makes ~18 of them. This times the CPU (user + system, from the children's
``resource`` usage) of ``podman image exists <absent>`` against this host's store and against an
empty store of its own (``--root``/``--runroot`` in a temporary folder), the two alternating for
``--rounds`` rounds of ``--calls`` calls each, in the same minute. The last line is
``images=<in the host's store> host_ms=<per call> empty_ms=<per call> ratio=<host/empty>``:
what ``prefect-harbor images prune`` buys each call.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import tempfile

from prefect_harbor.sandbox.engine import engine_env, podman_argv


def cpu_ms_per_call(extra: list[str], calls: int) -> float:
    """The CPU one ``podman image exists`` costs, in ms, over ``calls`` calls."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(calls):
        subprocess.run(podman_argv(*extra, "image", "exists", "prefect-harbor.local/absent:image"), env=engine_env(), capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    listed = subprocess.run(podman_argv("images", "--all", "--format", "json"), env=engine_env(), capture_output=True, check=True)
    images = len(json.loads(listed.stdout or b"[]"))
    host, empty = [], []
    with tempfile.TemporaryDirectory(prefix="empty-store-") as folder:
        own = ["--root", f"{folder}/root", "--runroot", f"{folder}/run"]
        cpu_ms_per_call(own, 2)  # the empty store is made on its first call
        for _ in range(args.rounds):
            host.append(cpu_ms_per_call([], args.calls))
            empty.append(cpu_ms_per_call(own, args.calls))
            print(f"round: host {host[-1]:.1f} ms, empty {empty[-1]:.1f} ms per call", flush=True)
    host_ms, empty_ms = statistics.median(host), statistics.median(empty)
    print(f"images={images} host_ms={host_ms:.1f} empty_ms={empty_ms:.1f} ratio={host_ms / empty_ms:.2f}")


if __name__ == "__main__":
    main()
