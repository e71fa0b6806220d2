"""A Harbor environment that runs each trial in one long-lived bubblewrap sandbox.

Harbor ships no environment that works without a container daemon or a cloud account.
This one needs only ``bwrap`` and util-linux (``nsenter``, ``setpriv``):

* ``start()`` launches ONE sandbox per trial: new pid/ipc/uts (and, for
  ``no-network`` tasks, net) namespaces whose init holds them open. Every ``exec``
  enters those namespaces with ``nsenter``, so a tmux server or a background daemon
  started by one exec is still there for the next.
* The base filesystem (the host's system directories by default, or a prepared
  ``rootfs``) is bound read-only; everything else the trial sees -- ``/``, ``/tmp``,
  ``/root``, the workdir, ``/tests``, ``/solution`` -- lives in a private directory
  per trial on the host, and Harbor's ``/logs/*`` are live bind mounts of the trial
  directory.
* Commands run with a Docker-like capability set (no ``CAP_SYS_ADMIN``), so nothing
  inside can remount the read-only base or escape the mount namespace.
* ``stop()`` kills the namespace's init: the kernel then kills every process in the
  sandbox. ``--die-with-parent`` does the same if the owning process dies.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import tarfile
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, override

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.definition import require_agent_environment_definition
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from prefect_harbor.sandbox.dockerfile import DockerfileRuntime, UnsupportedDockerfileError, parse_dockerfile
from prefect_harbor.sandbox.processes import kill_tree

#: The import path to give Harbor: ``EnvironmentConfig(import_path=IMPORT_PATH)``.
IMPORT_PATH = "prefect_harbor.sandbox.bubblewrap:BubblewrapEnvironment"

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Base-filesystem directories bound read-only when the base is the host itself. Only
#: the system tree: the host's /root, /home, /work, /srv and the like stay invisible.
HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "var")
#: Never taken from a base filesystem: the sandbox makes its own.
PRIVATE_DIRS = frozenset({"proc", "dev", "sys", "tmp", "root", "home", "run", "mnt", "media", "lost+found"})
#: Docker's default capability set: enough for root to own files, not to remount or escape.
EXEC_CAPABILITIES = (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid",
    "setpcap", "setfcap", "net_bind_service", "net_raw", "sys_chroot", "audit_write", "mknod",
)  # fmt: skip
_READY_TIMEOUT_SEC = 30
_STOP_TIMEOUT_SEC = 5


def default_sandboxes_dir() -> Path:
    return Path(tempfile.gettempdir()) / "prefect-harbor" / "sandboxes"


@dataclass(frozen=True)
class Identity:
    """Who a command runs as inside the sandbox."""

    uid: int
    gid: int
    name: str | None
    home: str


@dataclass
class _Sandbox:
    process: asyncio.subprocess.Process
    init_pid: int
    state_dir: Path


class BubblewrapEnvironment(BaseEnvironment):
    """One bubblewrap sandbox per trial; see the module docstring for the design."""

    _announced_images: set[str] = set()

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        rootfs: str | None = None,
        ignore_unsupported_dockerfile_instructions: bool = False,
        sandboxes_dir: str | None = None,
        **kwargs,
    ):
        """Extra options (``EnvironmentConfig.kwargs``):

        rootfs: a prepared root filesystem directory to use read-only instead of the
            host's system directories (e.g. made with ``debootstrap``).
        ignore_unsupported_dockerfile_instructions: skip RUN/COPY/ADD lines instead of
            refusing the task.
        sandboxes_dir: where the per-trial writable trees live (default: a
            ``prefect-harbor/sandboxes`` folder in the system temp directory).
        """
        self._rootfs = Path(rootfs).expanduser().resolve() if rootfs else None
        self._ignore_unsupported = ignore_unsupported_dockerfile_instructions
        self._sandboxes_dir = Path(sandboxes_dir).expanduser() if sandboxes_dir else default_sandboxes_dir()
        self._runtime = DockerfileRuntime()
        self._sandbox: _Sandbox | None = None
        # The log directories are live host mounts: Harbor reads rewards and logs in place.
        kwargs.setdefault("auto_mounting", True)
        super().__init__(
            environment_dir=environment_dir,
            environment_name=environment_name,
            session_id=session_id,
            trial_paths=trial_paths,
            task_env_config=task_env_config,
            **kwargs,
        )

    @staticmethod
    @override
    def type() -> str:
        return "bubblewrap"

    @property
    @override
    def capabilities(self) -> EnvironmentCapabilities:
        # no-network is a real empty network namespace, hence disable_internet.
        return EnvironmentCapabilities(mounted=True, disable_internet=True)

    @classmethod
    @override
    def preflight(cls) -> None:
        missing = [tool for tool in ("bwrap", "nsenter") if shutil.which(tool) is None]
        if missing:
            raise SystemExit(
                f"The bubblewrap sandbox needs {', '.join(missing)} on PATH: "
                "install it with `apt-get install bubblewrap util-linux`."
            )

    @override
    def validate_network_policy_support(self, network_policy: NetworkPolicy | None = None) -> None:
        policy = network_policy or self._network_policy
        if policy.network_mode == NetworkMode.ALLOWLIST:
            raise ValueError(
                "network_mode='allowlist' cannot be enforced by the bubblewrap sandbox: it "
                "gives a trial either the host's network ('public') or none "
                "('no-network'). Set the task's [environment] network_mode to one of "
                "those, or run it in a Harbor environment that enforces allowlists "
                "(e.g. type 'docker')."
            )
        super().validate_network_policy_support(network_policy)

    @override
    def _validate_definition(self) -> None:
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise ValueError(
                f"{self.environment_dir / 'docker-compose.yaml'}: multi-container tasks "
                "cannot run in the bubblewrap sandbox. Run this task in a Harbor "
                "environment with compose support (type 'docker')."
            )
        dockerfile = self.environment_dir / "Dockerfile"
        if dockerfile.is_file():
            self._runtime = parse_dockerfile(dockerfile)
            if self._runtime.unsupported and not self._ignore_unsupported:
                raise UnsupportedDockerfileError(dockerfile, self._runtime.unsupported)
        else:
            require_agent_environment_definition(
                self.environment_dir, docker_image=self.task_env_config.docker_image
            )
        if self._rootfs is not None and not (self._rootfs / "usr").is_dir():
            raise ValueError(
                f"rootfs {self._rootfs} is not a root filesystem (it has no usr/); "
                "prepare one with e.g. `debootstrap bookworm DIR` or leave rootfs unset "
                "to use the host's system directories."
            )

    @property
    def workdir(self) -> str:
        """The task's ``[environment] workdir``, else the Dockerfile's WORKDIR, else ``/``."""
        return self.task_env_config.workdir or self._runtime.workdir or "/"

    @property
    def state_dir(self) -> Path | None:
        """The host directory holding this sandbox's private tree, while it runs."""
        return self._sandbox.state_dir if self._sandbox else None

    @property
    def init_pid(self) -> int | None:
        """Host pid of the sandbox's init process, while it runs."""
        return self._sandbox.init_pid if self._sandbox else None

    # ------------------------------------------------------------------ lifecycle

    @override
    async def start(self, force_build: bool) -> None:
        if self._sandbox is not None:
            return
        self._announce_base_image()
        state_dir = self._sandboxes_dir / f"{self.session_id}.{uuid.uuid4().hex[:8]}"
        (state_dir / "root").mkdir(parents=True)
        (state_dir / "var-tmp").mkdir(mode=0o1777)
        os.chmod(state_dir / "var-tmp", 0o1777)
        info_read, info_write = os.pipe()
        try:
            with open(state_dir / "bwrap.log", "wb") as log:
                # Its own session: a signal to the owner's process group (a worker cancelling
                # the run) must reach the owner, which stops trials through Harbor -- not kill
                # sandboxes under it. The owner's death still kills them (--die-with-parent).
                process = await asyncio.create_subprocess_exec(
                    *self._bwrap_argv(state_dir, info_write),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    pass_fds=(info_write,),
                    start_new_session=True,
                )
            os.close(info_write)
            info_write = -1
            init_pid = await self._wait_until_ready(process, info_read, state_dir)
        finally:
            if info_write >= 0:
                os.close(info_write)
            os.close(info_read)
        self._sandbox = _Sandbox(process=process, init_pid=init_pid, state_dir=state_dir)
        (state_dir / "sandbox.json").write_text(
            json.dumps({"owner_pid": os.getpid(), "bwrap_pid": process.pid, "init_pid": init_pid})
        )
        await self._create_workdir()
        await self._upload_environment_dir_after_start()

    @override
    async def stop(self, delete: bool) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is None:
            return
        # Killing the pid namespace's init makes the kernel kill everything inside it. The
        # /proc walk runs in a thread: on the event loop it stalls every other trial.
        await asyncio.to_thread(kill_tree, sandbox.init_pid)
        await asyncio.to_thread(kill_tree, sandbox.process.pid)
        try:
            await asyncio.wait_for(asyncio.shield(sandbox.process.wait()), _STOP_TIMEOUT_SEC)
        except TimeoutError:
            self.logger.warning(f"bubblewrap sandbox {sandbox.process.pid} did not exit after SIGKILL")
        if delete:
            await asyncio.to_thread(shutil.rmtree, sandbox.state_dir, ignore_errors=True)
        else:
            self.logger.info(f"Kept the sandbox's private tree at {sandbox.state_dir}")

    def _announce_base_image(self) -> None:
        image = self._runtime.base_image or self.task_env_config.docker_image
        if image and image not in self._announced_images:
            self._announced_images.add(image)
            base = self._rootfs or "the host's system directories"
            self.logger.info(f"bubblewrap sandbox: image {image!r} is stood in for by {base} (read-only)")

    def _bwrap_argv(self, state_dir: Path, info_fd: int) -> list[str]:
        root = state_dir / "root"
        argv = ["bwrap", "--die-with-parent", "--new-session", "--info-fd", str(info_fd)]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if self._network_disabled:
            argv.append("--unshare-net")
        argv += ["--hostname", "sandbox", "--bind", str(root), "/"]
        argv += self._base_filesystem_args()
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--perms", "1777", "--dir", "/tmp", "--perms", "0700", "--dir", "/root"]
        argv += ["--dir", "/home", "--dir", "/run"]
        if (self._base_root / "var" / "tmp").is_dir():
            argv += ["--bind", str(state_dir / "var-tmp"), "/var/tmp"]
        for mount in self._mounts:
            argv += self._mount_args(mount)
        argv += ["--cap-drop", "ALL", "--chdir", "/"]
        argv += ["--", "/bin/sh", "-c", "echo ready && exec sleep infinity"]
        return argv

    @property
    def _base_root(self) -> Path:
        return self._rootfs or Path("/")

    def _base_filesystem_args(self) -> list[str]:
        if self._rootfs is None:
            names = [name for name in HOST_SYSTEM_DIRS if os.path.lexists(f"/{name}")]
        else:
            names = sorted(entry.name for entry in self._rootfs.iterdir() if entry.name not in PRIVATE_DIRS)
        args: list[str] = []
        for name in names:
            source = self._base_root / name
            if source.is_symlink():
                args += ["--symlink", os.readlink(source), f"/{name}"]
            elif source.is_dir():
                args += ["--ro-bind", str(source), f"/{name}"]
        return args

    @staticmethod
    def _mount_args(mount: dict) -> list[str]:
        if mount.get("type") != "bind":
            raise ValueError(
                f"The bubblewrap sandbox supports only bind mounts, not {mount.get('type')!r} "
                f"(target {mount.get('target')})."
            )
        source = Path(mount["source"])
        if not source.exists():
            source.mkdir(parents=True, exist_ok=True)
        flag = "--ro-bind" if mount.get("read_only") else "--bind"
        return [flag, str(source), str(mount["target"])]

    async def _wait_until_ready(self, process: asyncio.subprocess.Process, info_read: int, state_dir: Path) -> int:
        """Wait for the sandbox's first line of output; bwrap has then set everything up."""
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), _READY_TIMEOUT_SEC)
        except BaseException:
            kill_tree(process.pid)
            raise
        if line.strip() != b"ready":
            await process.wait()
            log = (state_dir / "bwrap.log").read_text(errors="replace").strip()
            shutil.rmtree(state_dir, ignore_errors=True)
            raise RuntimeError(f"bubblewrap failed to start the sandbox (exit {process.returncode}): {log}")
        info = json.loads(os.read(info_read, 65536))
        return int(info["child-pid"])

    async def _create_workdir(self) -> None:
        # Created world-writable: it stands in for a Dockerfile that chowns it to the agent user.
        workdir = shlex.quote(self.workdir)
        result = await self.exec(f"[ -d {workdir} ] || {{ mkdir -p {workdir} && chmod 0777 {workdir}; }}", user="root", cwd="/")
        if result.return_code != 0:
            raise RuntimeError(f"Could not create the workdir {self.workdir} in the sandbox: {result.stderr}")

    # ------------------------------------------------------------------ exec

    @override
    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        identity = self.identity(self._resolve_user(user))
        environment = {"PATH": DEFAULT_PATH, "HOME": identity.home, "HOSTNAME": "sandbox"}
        if identity.name:
            environment["USER"] = identity.name
        environment |= self._runtime.env
        environment |= self._merge_env(env) or {}
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            return_code = await self._run(
                ["/bin/bash", "-c", command],
                identity=identity,
                cwd=cwd or self.workdir,
                environment=environment,
                stdout=stdout,
                stderr=stderr,
                timeout_sec=timeout_sec,
            )
            return ExecResult(stdout=_read_text(stdout), stderr=_read_text(stderr), return_code=return_code)

    async def _run(
        self,
        argv: list[str],
        *,
        identity: Identity,
        cwd: str,
        environment: dict[str, str],
        stdout: IO[bytes],
        stderr: IO[bytes],
        stdin: IO[bytes] | None = None,
        timeout_sec: float | None = None,
    ) -> int:
        """Run ``argv`` inside the sandbox; on timeout or cancellation kill its whole tree."""
        if self._sandbox is None:
            raise RuntimeError("The bubblewrap sandbox is not running: call start() first.")
        process = await asyncio.create_subprocess_exec(
            *self._enter_argv(identity, cwd),
            *argv,
            stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=environment,
            start_new_session=True,
        )
        try:
            return await asyncio.wait_for(process.wait(), timeout_sec)
        except TimeoutError:
            kill_tree(process.pid)
            await process.wait()
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        except BaseException:
            kill_tree(process.pid)
            raise

    def _enter_argv(self, identity: Identity, cwd: str) -> list[str]:
        assert self._sandbox is not None
        # nsenter resolves --wd=PATH on the host, before entering: change directory inside.
        argv = ["nsenter", "--all", f"--target={self._sandbox.init_pid}", "--root", "--wd", "--"]
        argv += ["setpriv"]
        if identity.uid != 0:
            argv += [f"--reuid={identity.uid}", f"--regid={identity.gid}"]
            argv += ["--init-groups"] if identity.name else ["--clear-groups"]
        caps = ",".join(f"+{cap}" for cap in EXEC_CAPABILITIES)
        argv += [f"--bounding-set=-all,{caps}", "--inh-caps=-all", "--"]
        argv += ["/bin/sh", "-c", 'cd -- "$0" && exec "$@"', cwd]
        return argv

    def identity(self, user: str | int | None) -> Identity:
        """Resolve a Harbor user (name, uid, ``name:group``; None = the image's USER or root)."""
        spec = str(user if user is not None else self._runtime.user or "root")
        name_or_uid, _, group = spec.partition(":")
        passwd = _read_database(self._base_root / "etc" / "passwd")
        entry = next((e for e in passwd if name_or_uid in (e[0], e[2])), None)
        if entry is None and not name_or_uid.isdigit():
            raise ValueError(
                f"unable to find user {name_or_uid!r} in {self._base_root / 'etc' / 'passwd'}: "
                "the sandbox shares its base filesystem's users; create the user there "
                "(or in the rootfs) or run the task as root."
            )
        uid = int(entry[2]) if entry else int(name_or_uid)
        gid = int(entry[3]) if entry else uid
        if group:
            groups = _read_database(self._base_root / "etc" / "group")
            match = next((g for g in groups if group in (g[0], g[2])), None)
            if match is None and not group.isdigit():
                raise ValueError(f"unable to find group {group!r} for user {spec!r}")
            gid = int(match[2]) if match else int(group)
        return Identity(uid=uid, gid=gid, name=entry[0] if entry else None, home=entry[5] if entry else "/")

    # ------------------------------------------------------------------ file transfer
    # Transfers run `tar`/`cat` INSIDE the sandbox, never host-side path operations on
    # the sandbox's tree: that tree is agent-controlled and may hold hostile symlinks.

    async def _transfer(self, argv: list[str], *, stdout: IO[bytes], stdin: IO[bytes] | None = None) -> None:
        root = self.identity("root")
        with tempfile.TemporaryFile() as stderr:
            code = await self._run(
                argv,
                identity=root,
                cwd="/",
                environment={"PATH": DEFAULT_PATH, "HOME": root.home},
                stdout=stdout,
                stderr=stderr,
                stdin=stdin,
            )
            if code != 0:
                raise RuntimeError(f"{shlex.join(argv)} failed in the sandbox (exit {code}): {_read_text(stderr)}")

    @override
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = PurePosixPath(target_path)
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                tar.add(str(source_path), arcname=target.name, recursive=False)
            archive.seek(0)
            await self._extract_in_sandbox(archive, str(target.parent))

    @override
    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        with tempfile.TemporaryFile() as archive:
            with tarfile.open(fileobj=archive, mode="w") as tar:
                for child in sorted(Path(source_dir).iterdir()):
                    tar.add(str(child), arcname=child.name)
            archive.seek(0)
            await self._extract_in_sandbox(archive, target_dir)

    async def _extract_in_sandbox(self, archive: IO[bytes], target_dir: str) -> None:
        script = f"mkdir -p {shlex.quote(target_dir)} && exec tar -x --no-same-owner -C {shlex.quote(target_dir)} -f -"
        with tempfile.TemporaryFile() as stdout:
            await self._transfer(["/bin/sh", "-c", script], stdout=stdout, stdin=archive)

    @override
    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as partial:
            try:
                await self._transfer(["cat", "--", source_path], stdout=partial)
            except BaseException:
                Path(partial.name).unlink(missing_ok=True)
                raise
        os.replace(partial.name, target)

    @override
    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as archive:
            await self._transfer(["tar", "-c", "-C", source_dir, "-f", "-", "."], stdout=archive)
            archive.seek(0)
            with tarfile.open(fileobj=archive, mode="r") as tar:
                tar.extractall(path=target, filter=transfer_tar_filter)


def _read_text(stream: IO[bytes]) -> str | None:
    stream.seek(0)
    data = stream.read()
    return data.decode(errors="replace") if data else None


def _read_database(path: Path) -> list[list[str]]:
    """Rows of a passwd/group-style file (empty when it does not exist)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [line.split(":") for line in lines if line and not line.startswith("#")]
