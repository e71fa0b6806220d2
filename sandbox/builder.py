"""The builder: buildah in a container of its own, so that a task's Dockerfile finds no host behind it.

A task's Dockerfile is its author's code, run at prewarm. Run by the host's buildah, it runs
beside the host's root, and any builder bug hands a step that root (CVE-2024-1753, in Debian
12's buildah 1.28: a bind mount's source followed out of its stage onto the host's ``/``).
Reading the Dockerfile first (:mod:`.build_guard`) is a second wall only. The first is this
container, as much a sandbox as a trial's:

* **its own buildah**: Debian 13's (1.39, which carries that fix), bootstrapped from Debian's
  mirror as :data:`BUILDER_IMAGE` (``prefect-harbor images builder``, or on the first build);
* **its own user namespace**: a fixed id range no host user owns (:data:`BUILDER_IDS`), so the
  builder's root, and every ``RUN`` step's, is nobody on the host. ``CAP_SYS_ADMIN`` is held
  there only, for buildah's chroot isolation (it mounts ``/proc`` and the layers); the steps
  themselves run with the trials' capabilities and seccomp profile, so they cannot ``unshare``;
* **its own files**: the build context and the build's other inputs read-only, its own storage
  (layer cache and bases), a scratch folder and an output folder; no other host file, and no
  host image but the bases it is handed, as archives;
* **the trials' walls**: the guarded ``prefect-harbor`` network (NAT out, no host service, no
  other container, so an ``ADD <url>`` buildah fetches itself reaches no host address either),
  the seccomp profile and capabilities, and a process limit.

The finished image leaves as an image archive that the host's podman loads: what it reads from
any registry. Builds of different tasks share the builder's layer cache, whose keys are the
instructions' text; :mod:`.build_guard` names every stage it adds by the image's content, so
no cached step crosses tasks with different content.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prefect_harbor.sandbox.engine import CONF_DIR, LABEL_OWNER, Completed, EngineError, podman, podman_sync
from prefect_harbor.sandbox.image_disk import cache_in_use, check_cache_if_due
from prefect_harbor.sandbox.janitor import ensure_watchdog
from prefect_harbor.sandbox.network import ensure_network
from prefect_harbor.sandbox.owners import owner_token
from prefect_harbor.sandbox.seccomp import seccomp_profile

#: Bump when the builder image's recipe changes, so hosts make the new one.
BUILDER_RECIPE = "1"
#: Debian 13's buildah (1.39) and what it needs; netavark stands for the "container-network-stack"
#: that containers-common depends on (buildah's chroot isolation uses no network stack).
BUILDER_PACKAGES = ("buildah", "netavark", "ca-certificates")
BUILDER_SUITE = "trixie"
BUILDER_IMAGE = f"prefect-harbor.local/builder:{BUILDER_SUITE}-{BUILDER_RECIPE}"
#: The host ids the builder's ids 0-65535 map to (root's case): above any ordinary user's and
#: subordinate ranges, below the ``containers`` range podman's ``--userns=auto`` takes.
BUILDER_IDS = (0x70000000, 65536)
logger = logging.getLogger(__name__)
#: The label every builder container carries (beside the owner's), so the janitor can tell them apart.
LABEL_BUILD = "io.prefect-harbor.build"
_IN_BUILDER_CONF = "/etc/prefect-harbor/containers.conf"
_IN_BUILDER_SECCOMP = "/etc/prefect-harbor/seccomp.json"
#: What the builder runs: make each base known by its id under the name the Dockerfile uses,
#: build, and write the image out. Arguments: the tag, pairs of (base id, name), ``--``, buildah build's.
#: Images cross as docker archives, whose layers are plain tars: buildah 1.39 gzips every layer it
#: writes to an OCI archive (``--disable-compression`` notwithstanding), which made the export and
#: the load the most of a build's cost (``benchmarks/builder_cost.py``).
_BUILD_SCRIPT = """set -eu
tag=$1; shift
while [ "$1" != -- ]; do
  buildah inspect --type image "$1" > /dev/null 2>&1 || buildah pull --quiet "docker-archive:/bases/$1.tar" > /dev/null
  buildah tag "$1" "$2"; shift 2
done
shift
buildah build "$@"
buildah push --quiet "$tag" "docker-archive:/out/image.tar:$tag"
"""


class BuilderError(EngineError):
    """The builder could not be made or started; the message says why and what to do."""


def builder_home() -> Path:
    """Where the builder keeps its storage, bases and scratch: a folder only this user can read."""
    default = Path("/var/lib/prefect-harbor/builder") if os.geteuid() == 0 else Path.home() / ".local/share/prefect-harbor/builder"
    home = Path(os.environ.get("PREFECT_HARBOR_BUILDER_HOME") or default)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)
    return home


def id_map() -> list[str]:
    """The builder's user namespace: ids 0-65535 onto :data:`BUILDER_IDS` (root), or onto the
    user's subordinate ids (rootless podman, where container id 1 is the first of them)."""
    first = BUILDER_IDS[0] if os.geteuid() == 0 else 1
    return [option for flag in ("--uidmap", "--gidmap") for option in (flag, f"0:{first}:{BUILDER_IDS[1]}")]


def _owned_by_builder(path: Path) -> Path:
    """``path`` (a folder) made, and owned by the builder's root, which writes into it."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, BUILDER_IDS[0], BUILDER_IDS[0])
    else:
        podman_sync("unshare", "chown", "1:1", str(path)).check(f"giving {path} to the builder")
    return path


def _hand_over(source: Path, target: Path) -> None:
    """A copy of the folder ``source`` at ``target``, owned by the builder's ids.

    The builder's root is nobody on the host: it could not read a task's files that only their
    owner may (Docker's builder, as root, reads them), and a link in the context leads into the
    builder's own file system, never the host's. Modes are kept; ``COPY`` sets ownership anyway.
    """
    target.mkdir(parents=True)
    subprocess.run(["cp", "-a", "--", f"{source}/.", str(target)], check=True, capture_output=True)
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "--no-dereference", f"{BUILDER_IDS[0]}:{BUILDER_IDS[0]}", str(target)], check=True, capture_output=True)
    else:
        podman_sync("unshare", "chown", "-R", "--no-dereference", "1:1", str(target)).check(f"giving {target} to the builder")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_builder_image(mirror: str | None = None, *, force: bool = False) -> str:
    """:data:`BUILDER_IMAGE`, bootstrapped from Debian's mirror the first time (~45 s, ~150 MB fetched)."""
    if not force and podman_sync("image", "exists", BUILDER_IMAGE).returncode == 0:
        return BUILDER_IMAGE
    from prefect_harbor.sandbox.bootstrap import debootstrap_image  # it imports the image module, which imports this one

    with _locked(builder_home() / "image.lock"):
        if force or podman_sync("image", "exists", BUILDER_IMAGE).returncode != 0:
            try:
                debootstrap_image(BUILDER_SUITE, BUILDER_IMAGE, mirror, include=BUILDER_PACKAGES)
            except EngineError as error:
                raise BuilderError(
                    f"the image builder ({BUILDER_IMAGE}: Debian {BUILDER_SUITE}'s buildah) could not be bootstrapped from the host's "
                    f"Debian mirror: {error}. Fix: make the mirror reachable and run `prefect-harbor images builder`."
                ) from None
    return BUILDER_IMAGE


@dataclass
class BuildJob:
    """One image build, as the builder is handed it."""

    context: Path
    dockerfile: str  # the text to build (guarded, bases pinned)
    tag: str
    #: Names the Dockerfile gives its external images (its pinned FROM and ``COPY --from``) -> their host image ids.
    bases: Mapping[str, str] = field(default_factory=dict)
    #: Extra named build contexts (``--build-context NAME=...``): host folders, handed over read-only.
    contexts: Mapping[str, Path] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    build_args: Mapping[str, str] = field(default_factory=dict)


async def run_build(job: BuildJob, *, timeout_sec: float, pids_limit: int) -> Completed:
    """Build ``job`` in a builder container and load the image into the host's storage as ``job.tag``.

    The result is the builder's output (its log); on timeout or cancellation the builder is
    removed and the error raised. A non-zero return code means the build (or its load) failed.
    """
    image = await asyncio.to_thread(ensure_builder_image)
    home = builder_home()
    checked = await asyncio.to_thread(check_cache_if_due, home)
    if checked is not None and checked.dropped:
        logger.info("%s", checked.describe())
    async with cache_in_use(home):
        return await _build_held(image, home, job, timeout_sec=timeout_sec, pids_limit=pids_limit)


async def _build_held(image: str, home: Path, job: BuildJob, *, timeout_sec: float, pids_limit: int) -> Completed:
    """:func:`run_build`, the builder's cache held (:func:`.image_disk.cache_in_use`)."""
    archives = {image_id: await _base_archive(image_id, home) for image_id in sorted(set(job.bases.values()))}
    with tempfile.TemporaryDirectory(prefix="build-", dir=home) as scratch_dir:
        scratch = Path(scratch_dir)
        (scratch / "Dockerfile").write_text(job.dockerfile)
        inputs = {"context": job.context, **{f"contexts/{n}": folder for n, folder in enumerate(job.contexts.values())}}
        for target, source in inputs.items():
            await asyncio.to_thread(_hand_over, source, scratch / target)
        out = await asyncio.to_thread(_owned_by_builder, scratch / "out")
        name = f"prefect-harbor-build-{secrets.token_hex(6)}"
        argv = await _run_argv(image, name, job, scratch, out, archives, pids_limit, home)
        await asyncio.to_thread(ensure_watchdog)  # the builder goes with its owner, like a trial's container
        try:
            done = await podman(*argv, timeout=timeout_sec)
            if done.returncode != 0 and runtime_could_not_start(done.stderr):
                await podman("rm", "--force", "--time", "0", name)
                done = await podman(*argv, timeout=timeout_sec)
        except (TimeoutError, asyncio.CancelledError):
            await asyncio.shield(podman("rm", "--force", "--time", "0", name))
            raise
        if done.returncode != 0:
            return done
        archive = out / "image.tar"
        if not archive.is_file() or archive.is_symlink():  # the builder wrote it: a link could point podman at a host file
            return Completed(1, done.stdout, done.stderr + b"\nthe builder left no image archive (or not a plain file) in its output folder")
        if (names := await asyncio.to_thread(_archive_names, archive)) != [[job.tag]]:
            # podman load tags what the archive names: a builder a step took over could name a base or another task's image.
            return Completed(1, done.stdout, done.stderr + f"\nthe builder's archive names {names!r}, not only {job.tag!r}: not loaded".encode())
        loaded = await podman("load", "--quiet", "--input", str(archive), timeout=timeout_sec)
        if loaded.returncode != 0:
            return Completed(loaded.returncode, done.stdout, done.stderr + b"\nloading the built image failed: " + loaded.stderr)
        return done


#: What runc says when it could not start a container for a reason of the host's moment, not the
#: build's: sealing its own copy (a memfd) failed while the machine was busy. Seen under load in CI.
_RUNTIME_BUSY = re.compile(rb"^(?=[^\n]*runc)(?=[^\n]*memfd)[^\n]*(resource busy|temporarily unavailable)", re.IGNORECASE | re.MULTILINE)


def runtime_could_not_start(stderr: bytes) -> bool:
    """Whether the builder's container never started because the runtime was momentarily busy:
    the build never ran, so it is tried once more (a build's own failure is never retried)."""
    return _RUNTIME_BUSY.search(stderr) is not None


async def _run_argv(
    image: str, name: str, job: BuildJob, scratch: Path, out: Path, archives: dict[str, Path], pids_limit: int, home: Path
) -> list[str]:
    """``podman run`` of the builder for ``job``: what it sees, and its walls (the module docstring)."""
    storage = await asyncio.to_thread(_owned_by_builder, home / "storage")
    var_tmp = await asyncio.to_thread(_owned_by_builder, home / "tmp")  # cache mounts live there; not on the overlay root
    profile = await asyncio.to_thread(seccomp_profile)
    network = await asyncio.to_thread(ensure_network)
    argv = ["run", "--rm", "--name", name, "--label", f"{LABEL_OWNER}={owner_token()}", "--label", f"{LABEL_BUILD}={job.tag}"]
    argv += [*id_map(), "--cap-add", "SYS_ADMIN", "--network", network, "--pids-limit", str(pids_limit), "--http-proxy=false"]
    argv += ["--security-opt", "label=disable", "--env", f"CONTAINERS_CONF={_IN_BUILDER_CONF}"]
    if profile is not None:
        argv += ["--security-opt", f"seccomp={profile}", "--volume", f"{profile}:{_IN_BUILDER_SECCOMP}:ro"]
    argv += ["--volume", f"{CONF_DIR / 'containers.conf'}:{_IN_BUILDER_CONF}:ro"]
    argv += ["--volume", f"{storage}:/var/lib/containers", "--volume", f"{var_tmp}:/var/tmp", "--volume", f"{out}:/out"]
    argv += ["--volume", f"{scratch / 'context'}:/context:ro", "--volume", f"{scratch / 'Dockerfile'}:/build/Dockerfile:ro"]
    for image_id, archive in archives.items():
        argv += ["--volume", f"{archive}:/bases/{image_id}.tar:ro"]
    build = ["--isolation", "chroot", "--layers", "--pull=never", "-f", "/build/Dockerfile", "-t", job.tag]
    if profile is not None:
        build += ["--security-opt", f"seccomp={_IN_BUILDER_SECCOMP}"]
    for index, context_name in enumerate(job.contexts):
        argv += ["--volume", f"{scratch / 'contexts' / str(index)}:/contexts/{index}:ro"]
        build += ["--build-context", f"{context_name}=/contexts/{index}"]
    for key, value in job.labels.items():
        build += ["--label", f"{key}={value}"]
    for key, value in job.build_args.items():
        build += ["--build-arg", f"{key}={value}"]
    pairs = [part for name_, image_id in job.bases.items() for part in (image_id, name_)]
    return [*argv, image, "sh", "-c", _BUILD_SCRIPT, "build", job.tag, *pairs, "--", *build, "/context"]


def _archive_names(archive: Path) -> list[list[str]] | None:
    """The tags each image of a docker archive carries (its ``manifest.json``, what ``podman load``
    applies), or None when the archive has no readable one."""
    try:
        with tarfile.open(archive) as tar:
            # One only: readers differ on which of several they take.
            (member,) = [member for member in tar.getmembers() if os.path.normpath(member.name) == "manifest.json"]
            handle = tar.extractfile(member) if member.isfile() and member.size <= 1 << 20 else None
            entries = json.load(handle) if handle is not None else None
        return [list(entry.get("RepoTags") or []) for entry in entries] if isinstance(entries, list) else None
    except (OSError, KeyError, ValueError, tarfile.TarError, AttributeError, TypeError):
        return None


async def _base_archive(image_id: str, home: Path) -> Path:
    """The host image ``image_id`` as an archive the builder can read (plain-tar layers): saved once per id."""
    bases = home / "bases"
    bases.mkdir(exist_ok=True, mode=0o700)
    archive = bases / f"{image_id}.docker-archive.tar"
    if archive.is_file():
        return archive
    with tempfile.TemporaryDirectory(prefix="save-", dir=bases) as staging:
        saving = Path(staging, "image.tar")
        saved = await podman("save", "--quiet", "--format", "docker-archive", "--output", str(saving), image_id, timeout=1800)
        saved.check(f"saving base image {image_id[:12]} for the builder")
        saving.chmod(0o644)  # the builder's root is nobody on the host: it reads the archive as "other"
        saving.replace(archive)
    return archive
