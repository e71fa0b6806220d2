"""What a trial's engine calls cost through podman's CLI and through its REST service.

    .venv/bin/python benchmarks/engine_service.py --calls 20

In one process, on one running container of the ``reward-txt`` example image, the same four
calls a trial makes most (an exec, a file copied in, a file copied out, an inspect) run as CLI
commands (``podman exec``, ``podman cp``, ``podman inspect``) and through the service
(``sandbox/engine_service.py``: what the sandbox uses), in alternating phases (CLI, service,
service, CLI), ``--calls`` of each per phase, one call at a time. Per way: the machine's CPU per
call (``/proc/stat``, every process included: podman, conmon, runc, the service) and the wall
per call. Run it on a quiet machine: the machine's CPU counts everyone's.

The last line reads ``ratio=<service CPU / CLI CPU per call> overhead_ms=<service - CLI wall ms
per call> peak_rss_mb=... loop_p99_ms=-``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath

os.environ.setdefault("HARBOR_TELEMETRY", "0")

import prefect_harbor  # noqa: E402,F401  (offline defaults before harbor is imported)
from prefect_harbor.sandbox.container_exec import exec_in  # noqa: E402
from prefect_harbor.sandbox.engine import podman  # noqa: E402
from prefect_harbor.sandbox.engine_service import engine_call, segment  # noqa: E402
from prefect_harbor.sandbox.images import image_resolver  # noqa: E402
from prefect_harbor.sandbox.transfer import copy_file_out, copy_in, pack  # noqa: E402

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "reward-txt"


def machine_cpu_sec() -> float:
    """CPU time every process on the machine has used (user, nice, system, irq, softirq), in seconds."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:8]
    busy = sum(int(value) for index, value in enumerate(fields) if index != 3)  # all but idle
    return busy / os.sysconf("SC_CLK_TCK")


async def cli_call(container: str, payload: Path, scratch: Path) -> None:
    (await podman("exec", container, "sh", "-c", "echo ok")).check("exec")
    with payload.open("rb") as archive:
        (await podman("cp", "--archive=false", "-", f"{container}:/", stdin=archive.read())).check("cp in")
    (await podman("cp", f"{container}:/tmp/payload.txt", str(scratch / "out-cli.txt"))).check("cp out")
    (await podman("inspect", "--type", "container", container)).check("inspect")


async def service_call(container: str, payload: Path, scratch: Path) -> None:
    done = await exec_in(container, ["sh", "-c", "echo ok"], workdir=None, variables={}, timeout_sec=60, user=None, running=lambda _: True)
    assert done.return_code == 0, done
    await copy_in(container, payload, PurePosixPath("/tmp/payload.txt"))
    await copy_file_out(container, "/tmp/payload.txt", scratch / "out-service.txt", max_bytes=1 << 20, on_cut=lambda *_: None)
    assert (await engine_call("GET", f"/libpod/containers/{segment(container)}/json")).status_code == 200  # what ContainerRoot.of asks


async def phase(call, calls: int, *args) -> tuple[float, float]:
    """(machine CPU s, wall s) per call of ``call`` over ``calls`` calls."""
    cpu, wall = machine_cpu_sec(), time.perf_counter()
    for _ in range(calls):
        await call(*args)
    return (machine_cpu_sec() - cpu) / calls, (time.perf_counter() - wall) / calls


async def main(calls: int) -> None:
    image = await image_resolver().ensure_built(TASK / "environment", "reward-txt", timeout_sec=900)
    container = f"bench-engine-{uuid.uuid4().hex[:8]}"
    (await podman("run", "--detach", "--name", container, "--network", "none", image, "sleep", "infinity")).check("run")
    try:
        with tempfile.TemporaryDirectory() as scratch_name:
            scratch = Path(scratch_name)
            payload = scratch / "payload.txt"
            payload.write_text("x" * 4096)
            archive = scratch / "payload.tar"
            with archive.open("wb") as into:
                pack(payload, PurePosixPath("/tmp/payload.txt"), into)
            await service_call(container, payload, scratch)  # the service started, outside the figures
            results: dict[str, list[tuple[float, float]]] = {"cli": [], "service": []}
            for way in ("cli", "service", "service", "cli"):
                if way == "cli":
                    results[way].append(await phase(cli_call, calls, container, archive, scratch))
                else:
                    results[way].append(await phase(service_call, calls, container, payload, scratch))
    finally:
        await podman("rm", "--force", "--time", "0", container)
    figures = {way: (sum(c for c, _ in runs) / len(runs), sum(w for _, w in runs) / len(runs)) for way, runs in results.items()}
    for way, (cpu, wall) in figures.items():
        print(f"{way:>7}: exec + cp in + cp out + inspect: {cpu * 1000:.0f} ms of machine CPU, {wall * 1000:.0f} ms wall per call")
    ratio = figures["service"][0] / figures["cli"][0]
    overhead = (figures["service"][1] - figures["cli"][1]) * 1000
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ratio={ratio:.3f} overhead_ms={overhead:.1f} peak_rss_mb={peak:.0f} loop_p99_ms=-")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="rounds of the four calls per phase")
    asyncio.run(main(parser.parse_args().calls))
