"""What the container sandbox costs, against the engine alone and against Harbor's own podman environment.

Runs, in one process and one invocation, on the same image and the same task:
  1. raw engine cycles: ``podman run -d``, three ``podman exec``, a ``podman cp`` in and one out,
     ``podman rm -f`` (the floor: the same engine calls the lifecycle makes);
  2. our trial lifecycle: ContainerEnvironment start, three execs, an upload and a download, stop;
  3. image builds: a cold build (a fresh layer on the examples' cached base layers) and a
     cached lookup of the same task (which must build nothing);
  4. whole oracle trials (Harbor's Trial) in our environment, and in Harbor's ``podman``
     environment (its DockerEnvironment over podman-compose), unless --skip-harbor-podman.

    .venv/bin/python benchmarks/container_cost.py --repeats 10 --trials 5

Its last line reads ``ratio=<lifecycle/raw> overhead_ms=<lifecycle-raw per cycle> peak_rss_mb=...
loop_p99_ms=- trial_speedup=<harbor podman trial / our trial>`` (the loop's lag is not sampled here). Figures compare within one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("HARBOR_TELEMETRY", "0")

from harbor.models.task.config import EnvironmentConfig as TaskEnvironmentConfig  # noqa: E402
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig  # noqa: E402
from harbor.models.trial.paths import TrialPaths  # noqa: E402
from harbor.trial.trial import Trial  # noqa: E402

import prefect_harbor  # noqa: E402,F401  (offline defaults before harbor is imported)
from prefect_harbor.sandbox import IMPORT_PATH, ContainerEnvironment  # noqa: E402
from prefect_harbor.sandbox.engine import engine_env, podman, podman_sync  # noqa: E402
from prefect_harbor.sandbox.images import ImageResolver, image_resolver  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "examples" / "tasks" / "reward-txt"
EXECS = ("true", "echo hello", "ls /")


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


async def raw_cycles(image: str, payload: bytes, repeats: int) -> list[float]:
    """The floor: the same engine calls the lifecycle needs, with nothing of ours around them."""
    timings = []
    for _ in range(repeats):
        began = time.perf_counter()
        container = (await podman("run", "-d", "--init", "--network", "none", image, "sleep", "infinity")).check("run").text
        for command in EXECS:
            (await podman("exec", container, "sh", "-c", command)).check("exec")
        (await podman("cp", "-", f"{container}:/tmp", stdin=payload)).check("cp in")
        (await podman("cp", f"{container}:/tmp/payload", "-")).check("cp out")
        (await podman("rm", "-f", "-t", "0", container)).check("rm")
        timings.append(time.perf_counter() - began)
    return timings


async def lifecycle_cycles(environment_dir: Path, scratch: Path, repeats: int) -> list[float]:
    payload = scratch / "payload"
    payload.mkdir()
    (payload / "file.txt").write_text("x" * 4096)
    timings = []
    for n in range(repeats):
        paths = TrialPaths(trial_dir=scratch / f"lifecycle{n}")
        paths.mkdir()
        env = ContainerEnvironment(
            environment_dir=environment_dir, environment_name="bench", session_id=f"bench{n}",
            trial_paths=paths, task_env_config=TaskEnvironmentConfig(network_mode="no-network"),
        )  # fmt: skip
        began = time.perf_counter()
        await env.start(force_build=False)
        for command in EXECS:
            assert (await env.exec(command)).return_code == 0
        await env.upload_dir(payload, "/tmp/payload")
        await env.download_dir("/tmp/payload", scratch / f"back{n}")
        await env.stop(delete=True)
        timings.append(time.perf_counter() - began)
    return timings


async def builds(scratch: Path) -> tuple[float, float]:
    """(cold build seconds, cached lookup seconds) of a task one fresh layer above the examples' image."""
    context = scratch / "build" / "environment"
    context.mkdir(parents=True)
    (context / "Dockerfile").write_text((TASK / "environment" / "Dockerfile").read_text() + f"RUN echo {uuid.uuid4().hex} > /build-id\n")
    ImageResolver._known.clear()
    began = time.perf_counter()
    await image_resolver().ensure_built(context, "bench-build", timeout_sec=900)
    cold = time.perf_counter() - began
    ImageResolver._known.clear()
    resolver = image_resolver()
    began = time.perf_counter()
    await resolver.ensure_built(context, "bench-build", timeout_sec=900)
    cached = time.perf_counter() - began
    assert resolver.builds == 0, "a cached image was built again"
    return cold, cached


def payload_archive() -> bytes:
    """The lifecycle's upload as one tar stream: payload/file.txt, 4 KiB."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in (("payload", None), ("payload/file.txt", b"x" * 4096)):
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pinned_task(scratch: Path, image: str) -> Path:
    """The example task with its FROM naming a local image, so Harbor's podman environment needs no registry either."""
    task = scratch / "task"
    shutil.copytree(TASK, task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text().replace("FROM debian:bookworm-slim", f"FROM {image}"))
    return task


async def trials(task: Path, environment: EnvironmentConfig, trials_dir: Path, count: int) -> list[float]:
    timings = []
    for n in range(count):
        began = time.perf_counter()
        trial = await Trial.create(TrialConfig(task=TaskConfig(path=task), trials_dir=trials_dir, trial_name=f"t{n}", agent=AgentConfig(name="oracle"), environment=environment))
        result = await trial.run()
        timings.append(time.perf_counter() - began)
        rewards = result.verifier_result.rewards if result.verifier_result else None
        assert rewards == {"reward": 1.0}, (result.exception_info, rewards)
    return timings


async def main(repeats: int, count: int, skip_harbor_podman: bool) -> None:
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        ImageResolver._known.clear()
        image = await image_resolver().ensure_built(TASK / "environment", "reward-txt", timeout_sec=900)
        raw = await raw_cycles(image, payload_archive(), repeats)
        ours = await lifecycle_cycles(TASK / "environment", scratch, repeats)
        cold, cached = await builds(scratch)
        task = pinned_task(scratch, image)
        our_trials = await trials(task, EnvironmentConfig(import_path=IMPORT_PATH), scratch / "ours", count)
        harbor_trials: list[float] = []
        if not skip_harbor_podman:
            if shutil.which("podman-compose") is None:
                raise SystemExit("Harbor's podman environment needs podman-compose on PATH (it is in the dev group: uv sync), or pass --skip-harbor-podman.")
            os.environ.update({k: v for k, v in engine_env().items() if k.startswith("CONTAINERS_")})
            harbor_trials = await trials(task, EnvironmentConfig(type="podman"), scratch / "harbor", count)
            podman_sync("image", "prune", "-f", timeout=None)
    print(f"raw engine cycle (run -d, {len(EXECS)} exec, cp in, cp out, rm -f), {repeats}x: median {median_ms(raw):.0f} ms")
    print(f"our lifecycle (start, {len(EXECS)} exec, upload, download, stop), {repeats}x: median {median_ms(ours):.0f} ms")
    print(f"image build: cold {cold:.2f} s, cached {cached * 1000:.0f} ms (no build)")
    print(f"oracle trial in our container, {count}x: median {median_ms(our_trials):.0f} ms")
    if harbor_trials:
        print(f"oracle trial in Harbor's podman environment, {count}x: median {median_ms(harbor_trials):.0f} ms")
    ratio = statistics.median(ours) / statistics.median(raw)
    speedup = statistics.median(harbor_trials) / statistics.median(our_trials) if harbor_trials else float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"ratio={ratio:.3f} overhead_ms={median_ms(ours) - median_ms(raw):.1f} peak_rss_mb={peak:.0f} loop_p99_ms=- trial_speedup={speedup:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="engine and lifecycle cycles")
    parser.add_argument("--trials", type=int, default=5, help="whole oracle trials per environment")
    parser.add_argument("--skip-harbor-podman", action="store_true", help="leave out Harbor's podman environment (no podman-compose)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.repeats, arguments.trials, arguments.skip_harbor_podman))
