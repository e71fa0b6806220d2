"""Task images: built from the task's own Dockerfile by podman, cached by content.

An image's tag is a digest of everything that decides its content -- the build context
and Dockerfile (Harbor's own ``docker_build_context_hash``), the exact base images the
``FROM`` lines resolved to, the extra CA certificates -- so an unchanged task is never
rebuilt and a changed one always is. ``tests/`` and ``solution/`` are not part of the
context: editing them rebuilds nothing.

Base images (``FROM``, and ``COPY --from=`` an image) are found in this order: already in
local storage; pulled from the registry; bootstrapped from Debian's mirror (``prefect-harbor
images bootstrap``, stored as ``prefect-harbor.local/...``; a ``debian:<suite>`` or
``debian:<version>`` is bootstrapped on first use); a stand-in named in ``base_images``; a
stand-in this project ships (:mod:`.standins`: ubuntu, buildpack-deps, python:3.x, the
t-bench bases, uv), built from Debian's mirror and PyPI. A stand-in is warned about on every
use. Nothing else: a base that cannot be found fails with the fix.

A task's prebuilt ``docker_image`` is used as Harbor uses it; one that cannot be had that way
(Terminal-Bench 2.0 tasks name images on a registry this host may not reach) is built from
the task's own Dockerfile instead, with a WARNING naming both: the image was built from it.

A task's images, as its trials make them -- main's, each compose service's, each separate
verifier's (:class:`EnvironmentImages`) -- are what the prewarm step builds ahead of the
trials (:func:`prepare_task_image`) and finds already made (:func:`task_image_names`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from harbor.environments.definition import DOCKERFILE_NAME, require_agent_environment_definition, should_use_prebuilt_docker_image
from harbor.models.task.config import EnvironmentConfig, TaskConfig
from harbor.utils.container_cache import docker_build_context_hash

from prefect_harbor.sandbox.build_guard import Guarded, UnsafeDockerfileError, guard
from prefect_harbor.sandbox.builder import BuildJob, builder_home, run_build
from prefect_harbor.sandbox.compose import TESTS_DIR, Project, Service
from prefect_harbor.sandbox.compose import load as load_compose
from prefect_harbor.sandbox.dockerfile import (
    copy_from_images,
    create_workdirs,
    external_bases,
    lower_heredocs,
    parse_from_lines,
    pin_bases,
    pin_copy_sources,
    variable_copy_sources,
    with_arg_defaults,
)  # fmt: skip
from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC, EngineError, podman
from prefect_harbor.sandbox.engine_service import engine_call, segment
from prefect_harbor.sandbox.file_locks import polled_flock
from prefect_harbor.sandbox.image_disk import STAND_IN_PREFIX, TASK_LABEL, mark_used
from prefect_harbor.sandbox.interpolation import PASSTHROUGH_OPTION, ComposeVariables
from prefect_harbor.sandbox.limits import DEFAULT_PIDS_LIMIT
from prefect_harbor.sandbox.private import private_folder
from prefect_harbor.sandbox.proxy import container_proxy_variables
from prefect_harbor.sandbox.remote_sources import RemoteSourceError, fetch
from prefect_harbor.sandbox.separate_verifier import verifier_environments, verifier_image_kwargs
from prefect_harbor.sandbox.standins import StandIn, shipped_stand_in

#: Bump when the way images are built changes, so old cached tags are not reused.
#: 3: every WORKDIR of the final stage is created; COPY --from=<image> is pinned to its resolved image.
#: 4: built in the builder's container (:mod:`.builder`, Debian 13's buildah).
#: 5: with extra CA certificates, uv is told to trust the system store (/etc/uv/uv.toml).
RECIPE_VERSION = "5"
#: The environment option (kwargs) that multiplies a task's ``build_timeout_sec``.
BUILD_TIMEOUT_OPTION = "build_timeout_multiplier"
#: Where bootstrapped bases live: a registry name nobody can pull from by accident.
LOCAL_REGISTRY = "prefect-harbor.local"
#: Where task images are tagged (``podman images localhost/prefect-harbor/task`` lists them).
IMAGE_REPOSITORY = "localhost/prefect-harbor/task"
_CA_STAGE = "prefect-harbor-extra-ca"
_CA_DIR_IN_IMAGE = "/usr/local/share/ca-certificates/prefect-harbor"

logger = logging.getLogger(__name__)
#: Where images' warnings go: a logger, or a trial's logger adapter.
type LogTarget = logging.Logger | logging.LoggerAdapter[logging.Logger]


class ImageBuildError(RuntimeError):
    """A task image could not be built or found; the message ends with the build log's tail."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


class BaseImageNotFoundError(ImageBuildError):
    """A ``FROM`` (or ``docker_image``) reference is in no local storage and cannot be pulled."""


class BaseNotMadeError(BaseImageNotFoundError):
    """A base that would be bootstrapped or stood in on first use, which this resolver may not do (``prefect-harbor check``)."""


@dataclass(frozen=True)
class ImageSource:
    """How a task's main image was had: its prebuilt ``docker_image``, or a build of its Dockerfile (and why)."""

    image: str
    docker_image: str | None = None  # the prebuilt image used, or the one the build replaces
    built: bool = False
    reason: str = ""  # why the Dockerfile was built although the task names an image

    def __str__(self) -> str:
        if not self.built:
            return f"prebuilt docker_image {self.docker_image!r}"
        return f"built from environment/{DOCKERFILE_NAME}" + (f" ({self.reason})" if self.reason else "")


def normalize_reference(reference: str) -> str:
    """Docker's reading of an image reference: ``debian:bookworm`` is ``docker.io/library/debian:bookworm``."""
    name, digest = (reference.split("@", 1) + [""])[:2]
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        domain, path = "docker.io", name
    else:
        domain, path = first, rest
    if domain == "docker.io" and "/" not in path:
        path = f"library/{path}"
    if not digest and ":" not in path.rsplit("/", 1)[-1]:
        path += ":latest"
    return f"{domain}/{path}" + (f"@{digest}" if digest else "")


def bootstrapped_name(reference: str) -> str:
    """Where ``prefect-harbor images bootstrap REFERENCE`` stores its image."""
    normalized = normalize_reference(reference)
    return f"{LOCAL_REGISTRY}/{normalized.split('/', 1)[1]}"


@dataclass
class ImageSettings:
    """How images are found and built; from the environment's kwargs (see the block's fields)."""

    base_images: dict[str, str] = field(default_factory=dict)
    extra_ca_certs: list[Path] = field(default_factory=list)
    pull: bool = True
    max_parallel_builds: int = 2
    #: The most processes a build's RUN steps may have at once (a trial's ``pids_limit``).
    pids_limit: int = DEFAULT_PIDS_LIMIT
    #: Host files and folders copied into the image, as ``{"source", "target"}`` pairs (a
    #: prepared Python environment, for ``patch_dockerfile_with_sdk``). They must not change once made.
    baked_paths: list[dict] = field(default_factory=list)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "prefect-harbor" / "image-builds")
    #: Bootstrap Debian bases and build stand-ins on first use (off for ``prefect-harbor check``, which makes nothing).
    make_bases: bool = True
    #: What a task's ``build_timeout_sec`` is multiplied by (the backend's environment build timeout multiplier).
    build_timeout_multiplier: float = 1.0

    def __post_init__(self) -> None:
        self.base_images = {normalize_reference(k): v for k, v in self.base_images.items()}
        self.extra_ca_certs = [Path(p).expanduser() for p in self.extra_ca_certs]
        for pair in self.baked_paths:
            if not Path(pair["source"]).exists() or not Path(pair["target"]).is_absolute():
                raise ValueError(f"baked_paths: {pair} needs an existing source and an absolute target.")
        for certificate in self.extra_ca_certs:
            if not certificate.is_file():
                raise ValueError(f"extra_ca_certs: {certificate} is not a file; give PEM certificate files.")


class ImageResolver:
    """Finds bases and builds task images, once per content per process (and per host, by tag)."""

    _known: dict[str, str] = {}  # reference -> resolved local reference
    _stood_in: dict[str, str] = {}  # reference -> the warning every use of its stand-in repeats
    _shipped: set[str] = set()  # references resolved to a stand-in this project ships
    _image_ids: dict[str, str] = {}
    _unpullable: set[str] = set()

    def __init__(self, settings: ImageSettings) -> None:
        self.settings = settings
        self.builds = 0  # builds this resolver ran (a cached image costs none)
        self.sources: dict[str, ImageSource] = {}  # task image -> how it was had (task_image)

    # ------------------------------------------------------------------ bases

    async def resolve(self, reference: str, *, warn: LogTarget = logger, shipped: bool = True) -> str:
        """A local image for ``reference``, pulling or standing in as the module docstring says;
        without ``shipped``, a stand-in this project ships does not count as found."""
        normalized = normalize_reference(reference)
        if normalized in self._shipped and not shipped:
            raise BaseImageNotFoundError(f"image {reference!r} is not in local storage and cannot be pulled (only a stand-in could be had).")
        if normalized not in self._known:
            self._known[normalized] = await self._find(reference, normalized, warn, shipped)
        if normalized in self._stood_in:
            warn.warning(self._stood_in[normalized])
        return self._known[normalized]

    async def _find(self, reference: str, normalized: str, warn: LogTarget, shipped: bool = True) -> str:
        if await _exists(normalized):
            return normalized
        if self.settings.pull and normalized not in self._unpullable:
            pulled = await podman("pull", "--quiet", normalized, timeout=600)
            if pulled.returncode == 0:
                return normalized
            self._unpullable.add(normalized)
            logger.debug(f"Pulling {normalized} failed: {pulled.stderr.decode(errors='replace').strip()[-300:]}")
        bootstrapped = bootstrapped_name(reference)
        if await _exists(bootstrapped):
            warn.info(f"Base image {reference!r} cannot be pulled; using {bootstrapped!r}, bootstrapped from Debian's mirror.")
            return bootstrapped
        stand_in = self.settings.base_images.get(normalized)
        if stand_in:
            resolved = await self.resolve(stand_in, warn=warn) if stand_in != reference else normalized
            self._stood_in[normalized] = f"Base image {reference!r} is stood in by {resolved!r} (base_images); results may differ from the real image."
            return resolved
        if made := await self._bootstrap(reference, normalized, warn):
            return made
        if shipped and (shipped_image := shipped_stand_in(normalized)):
            resolved, what = await self._stand_in(shipped_image, reference, warn)
            self._stood_in[normalized] = (
                f"Base image {reference!r} cannot be pulled: stood in by {resolved!r}, {what} "
                "(a shipped stand-in: pull the real image, or map it in base_images); results may differ from the real image."
            )
            self._shipped.add(normalized)
            return resolved
        raise BaseImageNotFoundError(
            f"base image {reference!r} is not in local storage and cannot be pulled. Fix: pull it "
            f"where a registry is reachable (podman pull {normalized}), bootstrap it from Debian's mirror "
            f"(prefect-harbor images bootstrap {reference}, for debian:<suite>), or map it to a local image "
            f"in the backend's base_images."
        )

    async def _bootstrap(self, reference: str, normalized: str, warn: LogTarget) -> str | None:
        """``debian:<suite>`` or ``debian:<version>`` bootstrapped from Debian's mirror on first use, once
        per suite on this host (as ``prefect-harbor images bootstrap`` does); None for other references."""
        from prefect_harbor.sandbox.bootstrap import bootstrap, debian_suite  # it names its images with this module's helpers

        if (suite := debian_suite(normalized)) is None:
            return None
        if not self.settings.make_bases:
            raise BaseNotMadeError(f"base image {reference!r} is not in local storage: a sweep bootstraps it from Debian's mirror ({suite}) on first use.")
        async with polled_flock(self.settings.log_dir / f"bootstrap-{suite}.lock"):
            try:
                made = await asyncio.to_thread(bootstrap, normalized)
            except EngineError as error:
                raise BaseImageNotFoundError(
                    f"base image {reference!r} is not in local storage and cannot be pulled, and bootstrapping Debian {suite} from the "
                    f"host's Debian mirror failed: {error}. Fix: pull it where a registry is reachable, or map it to a local image in "
                    "the backend's base_images."
                ) from None
        warn.info(f"Base image {reference!r} cannot be pulled; bootstrapped {made!r} from Debian's mirror (its current {suite}).")
        return made

    async def _stand_in(self, stand_in: StandIn, reference: str, warn: LogTarget) -> tuple[str, str]:
        """The local image of a shipped stand-in (built from its context on first use) and what it is."""
        if stand_in.image:
            return await self.resolve(stand_in.image, warn=warn), stand_in.what
        folder, what = stand_in.folder, stand_in.what
        if stand_in.make is not None:
            if not self.settings.make_bases:
                raise BaseNotMadeError(f"base image {reference!r} is not in local storage: a sweep builds its shipped stand-in ({what}) on first use.")
            folder, what = await asyncio.to_thread(stand_in.make, self.settings.log_dir.parent / "stand-ins")
        assert folder is not None
        built = await self.ensure_built(
            folder, f"{STAND_IN_PREFIX}{reference}", timeout_sec=1800, build_args=stand_in.build_args, build=self.settings.make_bases, warn=warn
        )
        if not self.settings.make_bases and not await _exists(built):
            raise BaseNotMadeError(f"base image {reference!r} is not in local storage: a sweep builds its shipped stand-in ({what}) on first use.")
        return built, what

    async def image_id(self, reference: str) -> str:
        if reference not in self._image_ids:
            inspected = (await podman("image", "inspect", "--format", "{{.Id}}", reference)).check(f"inspect {reference}")
            self._image_ids[reference] = inspected.text
        return self._image_ids[reference]

    # ------------------------------------------------------------------ builds

    async def task_image(
        self, environment_dir: Path, name: str, config: EnvironmentConfig, *, force_build: bool = False, build: bool = True,
        warn: LogTarget = logger,
    ) -> str:  # fmt: skip
        """A task's image: its ``docker_image`` as Harbor decides to use it, else built from its Dockerfile.

        A ``docker_image`` that is neither local, pullable, bootstrapped nor mapped in ``base_images``
        is built from the task's own Dockerfile when it has one (a shipped stand-in for it would be
        further from it), with a WARNING naming both. :attr:`sources` says which was used.
        ``build=False`` stops short of building (``prefect-harbor check``): the tag is returned
        once the Dockerfile is read and its bases are resolved, whether or not the image exists.
        """
        prebuilt, reason = config.docker_image, ""
        has_dockerfile = (environment_dir / DOCKERFILE_NAME).is_file()
        if should_use_prebuilt_docker_image(environment_dir, docker_image=prebuilt, force_build=force_build):
            _refuse_private_image(prebuilt, f"{environment_dir.parent / 'task.toml'} [environment] docker_image")
            try:
                image = await self.resolve(prebuilt, warn=warn, shipped=not has_dockerfile)
            except BaseNotMadeError:  # check: the sweep will make it (bootstrap), so no reason to build instead
                raise
            except BaseImageNotFoundError as missing:
                if not has_dockerfile:
                    raise BaseImageNotFoundError(
                        f"the task's [environment] docker_image {prebuilt!r} is not in local storage and cannot be pulled, and the task "
                        f"has no environment/{DOCKERFILE_NAME} to build instead. Fix: pull or load the image on this host "
                        f"(podman pull {normalize_reference(prebuilt)}), map it to a local image in the backend's base_images, "
                        f"or add the Dockerfile it was built from."
                    ) from missing
                reason = f"docker_image {prebuilt!r} is not in local storage " + ("and cannot be pulled" if self.settings.pull else "(pull is off)")
                if build:
                    warn.warning(
                        f"The task's [environment] {reason}: building the task's own environment/{DOCKERFILE_NAME} instead, as "
                        "`harbor run --force-build` would (pull or load the image on this host to run the prebuilt one)."
                    )
            else:
                self.sources[image] = ImageSource(image, prebuilt)
                return image
        elif prebuilt:
            reason = "force_build"
        image = await self.ensure_built(environment_dir, name, timeout_sec=self.build_timeout_sec(config), build=build, warn=warn)
        self.sources[image] = ImageSource(image, prebuilt, built=True, reason=reason)
        return image

    async def service_image(
        self, service: Service, name: str, *, timeout_sec: float, build: bool = True, warn: LogTarget = logger
    ) -> str:
        """The image of a compose service beside main: built from its own context, or its ``image``
        found as a base is (local, pulled, bootstrapped or a stand-in)."""
        if service.build is not None:
            return await self.ensure_built(
                service.build.context, f"{name}.{service.name}", dockerfile=service.build.dockerfile, timeout_sec=timeout_sec, build=build, warn=warn
            )
        assert service.image is not None, "compose.load refuses a service without build or image"
        _refuse_private_image(service.image, f"compose service {service.name!r}")
        return await self.resolve(service.image, warn=warn)

    async def ensure_built(
        self, environment_dir: Path, name: str, *, timeout_sec: float, dockerfile: Path | None = None, build: bool = True,
        build_args: dict[str, str] | None = None, warn: LogTarget = logger,
    ) -> str:  # fmt: skip
        """The tag of the image built from ``environment_dir`` (and its ``Dockerfile``, or
        ``dockerfile``, its global ARG defaults set to ``build_args``), building it (with
        ``build``) unless an identical one exists."""
        dockerfile = dockerfile or environment_dir / "Dockerfile"
        try:
            text = with_arg_defaults(lower_heredocs(dockerfile.read_text()), build_args or {})
            froms = parse_from_lines(text)
        except ValueError as error:
            raise ImageBuildError(f"{dockerfile}: {error}") from None
        if not froms:
            raise ImageBuildError(f"{dockerfile}: no FROM line.")
        if named := variable_copy_sources(text):
            raise ImageBuildError(
                f"{dockerfile}: --from={named[0]} names an image through a variable, which the build could not pin to a base; "
                "write the image (or the stage) literally."
            )
        based_on, copied_from = external_bases(froms), copy_from_images(text, froms)
        for reference in [*based_on, *copied_from]:
            _refuse_private_image(reference, dockerfile)
        bases = {image: await self.resolve(image, warn=warn) for image in based_on}
        copied = {image: await self.resolve(image, warn=warn) for image in copied_from}
        text = create_workdirs(pin_copy_sources(text, copied))
        digest = hashlib.blake2b(digest_size=10)
        digest.update(f"recipe={RECIPE_VERSION}\0".encode())
        digest.update(docker_build_context_hash(context=environment_dir, dockerfile_path=dockerfile, build_args=build_args or None).encode())
        for written, resolved in sorted({**bases, **copied}.items()):
            digest.update(f"{written}={await self.image_id(resolved)}\0".encode())
        for certificate in self.settings.extra_ca_certs:
            digest.update(certificate.read_bytes())
        for pair in self.settings.baked_paths:  # content-addressed folders: the name and the top entry identify them
            made = Path(pair["source"]).stat()
            digest.update(f"baked={pair['source']}>{pair['target']}:{made.st_size}:{made.st_mtime_ns}\0".encode())
        # Named by content alone: tasks with identical environments share one image.
        tag = f"{IMAGE_REPOSITORY}:{digest.hexdigest()}"
        if self._known.get(tag) == tag:
            return tag
        try:  # before any build, and in `prefect-harbor check` too
            guarded = guard(text, environment_dir, tag.rsplit(":", 1)[-1], _cache_key(environment_dir, dockerfile))
        except UnsafeDockerfileError as refused:
            raise ImageBuildError(f"{dockerfile}: {refused}") from None
        if not build:
            return tag
        if not await _exists(tag):
            async with polled_flock(self.settings.log_dir / f"{_sanitize(tag)}.lock"):
                if not await _exists(tag):
                    async with _build_slot(self.settings.log_dir, self.settings.max_parallel_builds):
                        await self._build(environment_dir, dockerfile, name, guarded, {**bases, **copied}, tag, timeout_sec)
        self._known[tag] = tag
        await asyncio.to_thread(mark_used, builder_home(), tag)  # what `prefect-harbor images prune` reads
        return tag

    async def _build(
        self, context: Path, dockerfile: Path, name: str, guarded: Guarded, bases: dict[str, str], tag: str, timeout_sec: float
    ) -> None:  # fmt: skip
        """Build ``tag`` in the builder's sandbox (:mod:`.builder`) and keep its log, readable by this user only."""
        log_path = self.log_path(tag)
        with tempfile.TemporaryDirectory(prefix="prefect-harbor-build-") as scratch:
            contexts = await _downloads(guarded, Path(scratch, "downloads"), dockerfile)
            text_out = pin_bases(guarded.text, bases, self._trust_store_lines())
            for n, pair in enumerate(self.settings.baked_paths):
                source, target = Path(pair["source"]), pair["target"]
                contexts[f"prefect-harbor-baked-{n}"] = source if source.is_dir() else source.parent
                text_out += f"COPY --from=prefect-harbor-baked-{n} {'.' if source.is_dir() else source.name} {target}{'/' if source.is_dir() else ''}\n"
            if self.settings.extra_ca_certs:
                ca_dir = Path(scratch, "ca")
                ca_dir.mkdir()
                for n, certificate in enumerate(self.settings.extra_ca_certs):
                    (ca_dir / f"extra-{n}.crt").write_bytes(certificate.read_bytes())
                contexts[_CA_STAGE] = ca_dir
            job = BuildJob(
                context, text_out, tag, bases={resolved: await self.image_id(resolved) for resolved in set(bases.values())},
                contexts=contexts, labels={"io.prefect-harbor.recipe": RECIPE_VERSION, TASK_LABEL: name},
                build_args=await asyncio.to_thread(container_proxy_variables),
            )  # fmt: skip
            try:
                done = await run_build(job, timeout_sec=timeout_sec, pids_limit=self.settings.pids_limit)
            except TimeoutError:
                raise ImageBuildError(f"building {tag} took longer than the task's build_timeout_sec ({timeout_sec:g} s).") from None
        private_folder(log_path.parent, "build logs")
        _write_private(log_path, done.stdout + done.stderr)
        self.builds += 1
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-15:]
            stood_in = [self._stood_in[name] for name in sorted({normalize_reference(ref) for ref in bases}) if name in self._stood_in]
            note = stand_in_note(done.stdout + done.stderr, stood_in)
            raise ImageBuildError(f"building the task image from {dockerfile} failed (log: {log_path}):\n" + "\n".join(tail) + note, log_path)

    def build_timeout_sec(self, config: EnvironmentConfig) -> float:
        """How long one of the task's builds may take: its ``build_timeout_sec``, multiplied."""
        return config.build_timeout_sec * self.settings.build_timeout_multiplier

    def log_path(self, tag: str) -> Path:
        return self.settings.log_dir / f"{_sanitize(tag)}.log"

    def _trust_store_lines(self) -> list[str]:
        """With extra CA certificates: the lines that add them to each stage's trust store.

        So ``apt``, ``pip`` and ``curl`` behind an intercepting proxy work in RUN steps, and
        later in the trial. Without a shell in the base, the append is skipped. uv trusts only
        the roots compiled into it unless told to use the system's: uv's system settings
        (``/etc/uv/uv.toml``, unless the image has its own) say ``native-tls = true``, so uv
        trusts the bundle the CA went into (or goes into once ca-certificates is installed: it
        gathers /usr/local/share/ca-certificates). The bundle's harness runs uv with ``--no-config``.
        """
        if not self.settings.extra_ca_certs:
            return []
        return [
            f"COPY --from={_CA_STAGE} . {_CA_DIR_IN_IMAGE}/",
            "RUN for bundle in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do "
            f"[ -f \"$bundle\" ] && cat {_CA_DIR_IN_IMAGE}/*.crt >> \"$bundle\"; done; "
            "[ -e /etc/uv/uv.toml ] || { mkdir -p /etc/uv && echo 'native-tls = true' > /etc/uv/uv.toml; }; true",
        ]


#: apt's words for a package (or a version of one) its archive does not have.
_APT_MISSING = re.compile(
    rb"(Version '[^'\n]+' for '[^'\n]+' was not found|Unable to locate package \S+|Package '?\S+'? has no installation candidate)"
)


def stand_in_note(log: bytes, stood_in: list[str]) -> str:
    """What a failed build's message adds when it was built on stand-ins: which ones, and, when apt
    could not find a package or version, that the stand-in's archive (Debian's) is why, not the task."""
    if not stood_in:
        return ""
    missing = sorted({found.decode(errors="replace") for found in _APT_MISSING.findall(log)})
    lines = [f"This build ran on stand-ins: {' '.join(stood_in)}"]
    if missing:
        lines.append(
            f"apt could not find what the task asks for ({'; '.join(missing[:3])}): a stand-in installs from Debian's "
            "archive, the only one this machine reaches, which has neither the original image's distribution's package "
            "versions nor, for Ubuntu, its packages. This is the stand-in's limit, not the task's: give the real image "
            "(a registry, or base_images naming a local copy)."
        )
    return "\n" + "\n".join(lines)


async def _downloads(guarded: Guarded, folder: Path, dockerfile: Path) -> dict[str, Path]:
    """Fetch the guarded Dockerfile's ``ADD`` URLs (:mod:`.remote_sources`): the build contexts that hold them, by name."""
    contexts: dict[str, Path] = {}
    for context, file_name, url in guarded.downloads:
        contexts.setdefault(context, folder / context).mkdir(parents=True, exist_ok=True)
        try:
            await fetch(url, contexts[context] / file_name)
        except (RemoteSourceError, httpx.HTTPError) as failed:
            raise ImageBuildError(f"{dockerfile}: {failed}") from None
    return contexts


def _write_private(path: Path, data: bytes) -> None:
    """``data`` at ``path``, readable by this user only: a build log holds whatever a RUN step printed."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(data)


#: Images no task may build on, copy from or run: other tasks' images (their tests, their secrets) and the builder's.
PRIVATE_REPOSITORIES = (IMAGE_REPOSITORY, f"{LOCAL_REGISTRY}/builder")


def _refuse_private_image(reference: str, where: Path | str) -> None:
    """Refuse a task's reference to one of :data:`PRIVATE_REPOSITORIES`: they are this host's, not the task's."""
    normalized = normalize_reference(reference)
    if any(normalized.startswith((f"{repository}:", f"{repository}@")) for repository in PRIVATE_REPOSITORIES):
        raise ImageBuildError(
            f"{where}: {reference!r} is an image this host built for another task (or its builder); a task may not use it. "
            "Name a registry image or a base image instead."
        )


def _sanitize(name: str) -> str:
    name = re.sub(r"[^a-z0-9._-]", "-", name.lower())
    return name if re.match(r"^[a-z0-9]", name) else f"0{name}"


def _cache_key(environment_dir: Path, dockerfile: Path) -> str:
    """What names an environment's cache mounts: its folder and Dockerfile, not its content, so that
    a rebuild after an edit finds its caches warm, and no other task's build can reach them."""
    where = f"{environment_dir.resolve()}\0{dockerfile.resolve()}"
    return "env-" + hashlib.blake2b(where.encode(), digest_size=8).hexdigest()


async def _exists(reference: str) -> bool:
    """Whether ``reference`` is in local storage. An engine that cannot answer (not installed, broken)
    says no, as ``podman image exists`` does: what needs the image then fails in the engine's words."""
    try:
        found = await engine_call("GET", f"/libpod/images/{segment(reference)}/exists", timeout=STATE_CALL_TIMEOUT_SEC)
    except EngineError as error:
        logger.debug(f"Asking whether image {reference} exists: {error}")
        return False
    return found.status_code == 204


async def present_images(references: set[str]) -> set[str]:
    """Which of ``references`` (as the resolver names them) are in local storage, in one engine
    call: ``podman image exists`` costs ~60 ms of CPU each, one ``inspect`` of 50 names ~0.3 s."""
    if not references:
        return set()
    inspected = await podman("image", "inspect", "--format", "{{range .RepoTags}}{{.}} {{end}}", *sorted(references))
    return references & set(inspected.stdout.decode(errors="replace").split())  # a missing name fails the call but not the others' lines


@contextlib.asynccontextmanager
async def _build_slot(directory: Path, slots: int) -> AsyncIterator[int]:
    """One of ``slots`` host-wide build slots (its number): builds are CPU- and disk-bound, so a few at a time."""
    directory.mkdir(parents=True, exist_ok=True)
    handles = [(directory / f"build-slot-{n}.lock").open("w") for n in range(slots)]
    try:
        while True:
            for slot, handle in enumerate(handles):
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield slot
                finally:
                    fcntl.flock(handle, fcntl.LOCK_UN)
                return
            await asyncio.sleep(0.2)
    finally:
        for handle in handles:
            handle.close()


def default_extra_ca_certs() -> Sequence[Path]:
    """The host's locally added CAs (Debian/Ubuntu keep them in /usr/local/share/ca-certificates)."""
    root = Path("/usr/local/share/ca-certificates")
    return sorted(p for p in root.rglob("*.crt") if p.is_file()) if root.is_dir() else []


# ------------------------------------------------------------------ a task's images, as its trials make them


def image_resolver(
    base_images: dict[str, str] | None = None,
    extra_ca_certs: list[str] | None = None,
    pull: bool = True,
    max_parallel_builds: int = 2,
    baked_paths: list[dict] | None = None,
    pids_limit: int = DEFAULT_PIDS_LIMIT,
    make_bases: bool = True,
    build_timeout_multiplier: float = 1.0,
    **_: Any,
) -> ImageResolver:
    """The image resolver for an environment's kwargs (shared by trials and the prewarm step)."""
    certificates = default_extra_ca_certs() if extra_ca_certs is None else [Path(p) for p in extra_ca_certs]
    if max_parallel_builds < 1:
        raise ValueError(f"max_parallel_builds: {max_parallel_builds} must be at least 1.")
    settings = ImageSettings(
        base_images=dict(base_images or {}), extra_ca_certs=list(certificates), pull=pull,
        max_parallel_builds=max_parallel_builds, baked_paths=list(baked_paths or []), pids_limit=pids_limit, make_bases=make_bases,
        build_timeout_multiplier=build_timeout_multiplier,
    )  # fmt: skip
    return ImageResolver(settings)


def check_environment_definition(
    environment_dir: Path, docker_image: str | None, variables: ComposeVariables | None = None, warn: LogTarget | logging.LoggerAdapter | None = None
) -> Project | None:
    """The task's compose project, if any, its ``${VAR}`` from ``variables`` (what it did without
    warned about on ``warn``); refuse what this sandbox cannot start (compose keys it cannot
    honour, neither a Dockerfile nor an image)."""
    project = load_compose(environment_dir, str(TESTS_DIR), variables)
    for warning in project.warnings if project and warn else ():
        warn.warning(warning)  # type: ignore[union-attr]
    if not (environment_dir / "Dockerfile").is_file():
        require_agent_environment_definition(environment_dir, docker_image=docker_image or (project.main.image if project else None))
    return project


@dataclass(frozen=True)
class EnvironmentImages:
    """The images of one environment definition (a task's, or a separate verifier's): its main
    image, then one per compose service beside main, made by ``resolver``."""

    directory: Path
    config: EnvironmentConfig
    project: Project | None
    name: str
    resolver: ImageResolver
    logger: LogTarget | logging.LoggerAdapter

    @classmethod
    def read(
        cls, directory: Path, config: EnvironmentConfig, name: str, kwargs: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter
    ) -> EnvironmentImages:
        """The definition in ``directory`` checked, and a fresh resolver for ``kwargs`` (its build count is this call's)."""
        project = check_environment_definition(directory, config.docker_image, ComposeVariables.from_host(kwargs.get(PASSTHROUGH_OPTION) or ()), logger)
        return cls(directory, config, project, name, image_resolver(**kwargs), logger)

    async def main(self, *, force_build: bool = False, build: bool = True) -> str:
        """Main's image: the task's own, or the one its compose file names for main."""
        service = self.project.main if self.project else None
        config = self.config.model_copy(update={"docker_image": service.image}) if service and service.image else self.config
        return await self.resolver.task_image(self.directory, self.name, config, force_build=force_build, build=build, warn=self.logger)

    async def services(self, *, build: bool = True) -> dict[str, str]:
        """The image of each compose service beside main, by service name (built, or found by content)."""
        services = self.project.services.values() if self.project else ()
        return {
            service.name: await self.resolver.service_image(service, self.name, timeout_sec=self.resolver.build_timeout_sec(self.config), build=build, warn=self.logger)
            for service in services
        }


def _task(task_dir: Path) -> tuple[TaskConfig, str]:
    """The task's configuration, and its name as its images are named."""
    config = TaskConfig.model_validate_toml((task_dir / "task.toml").read_text())
    return config, config.task.short_name if config.task else task_dir.name


async def task_image_names(
    task_dir: Path, kwargs: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter, *, force_build: bool = False
) -> list[str]:  # fmt: skip
    """The images the task's trials would run, main first, then its compose services: named
    by content as a build would name them (bases resolved, pulled if need be), never built:
    a base still to bootstrap or stand in raises :class:`BaseNotMadeError`. With
    :func:`present_images`, how a prewarm finds a task with nothing to build."""
    config, name = _task(task_dir)
    kwargs = {**kwargs, "make_bases": False}
    images = EnvironmentImages.read(task_dir / "environment", config.environment, name, kwargs, logger)
    image = await images.main(force_build=force_build, build=False)
    services = await images.services(build=False)
    return [image, *services.values(), *await verifier_images(task_dir, config, name, kwargs, logger, build=False)]


@dataclass(frozen=True)
class PreparedImage:
    """A task's main image as its trials will run it, and how it was had."""

    image: str
    source: ImageSource
    #: Its build log, when this call built it (None for a cached or prebuilt image).
    build_log: Path | None = None


async def prepare_task_image(
    task_dir: Path, kwargs: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter, *, build: bool = True, force_build: bool = False
) -> PreparedImage:  # fmt: skip
    """Build (or find) the images of the task in ``task_dir`` as its trials will: the prewarm step.

    The images of its compose services are built too. A failed build raises
    :class:`ImageBuildError` with the log's tail. ``build=False`` (``prefect-harbor check``)
    stops before building: the environment definition, the Dockerfiles' FROM lines and their
    bases are checked, and nothing is pulled, bootstrapped or built.
    """
    config, name = _task(task_dir)
    kwargs = {**kwargs, "pull": kwargs.get("pull", True) and build, "make_bases": build}
    images = EnvironmentImages.read(task_dir / "environment", config.environment, name, kwargs, logger)
    image = await images.main(force_build=force_build, build=build)
    built = images.resolver.builds
    await images.services(build=build)
    await verifier_images(task_dir, config, name, kwargs, logger, build=build)
    return PreparedImage(image, images.resolver.sources[image], images.resolver.log_path(image) if built else None)


async def verifier_images(
    task_dir: Path, config: TaskConfig, name: str, kwargs: dict[str, Any], logger: logging.Logger | logging.LoggerAdapter, *, build: bool = True
) -> list[str]:
    """The images of the task's separate verifiers (:mod:`.separate_verifier`), main first then
    their compose services, made (with ``build``) as the trial's verifier will make them."""
    found: list[str] = []
    for definition in verifier_environments(task_dir, config):
        images = EnvironmentImages.read(definition.directory, definition.config, name, verifier_image_kwargs(kwargs, definition), logger)
        found.append(await images.main(build=build))
        found += (await images.services(build=build)).values()
    return found
