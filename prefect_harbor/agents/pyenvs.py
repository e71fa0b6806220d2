"""Python environments prepared once on the host and mounted read-only into sandboxes.

A trial must not download anything: there is no internet on the machines this runs on,
and installing the same requirements in every trial is slow everywhere. The
requirements of a workflow bundle, or of a native agent that runs inside the sandbox
(mini-swe-agent), are installed once per content hash into a virtual environment built
from this host's Python. Each trial sees that environment read-only at the same path,
together with the interpreter it links to and the ``uv`` binary that installs the
per-trial wheel: the local-sandbox counterpart of Osmosis's Dockerfile patch.

The interpreter was built for this host and loads some of its shared libraries
(``libssl``, ``libffi``, ``libsqlite3``, ...), which a task's image need not have. Those
libraries -- glibc itself excepted, which every glibc image has -- are copied once into a
folder mounted beside the environment (:func:`runtime_libraries`); the processes that run
the interpreter find them through ``LD_LIBRARY_PATH`` (:meth:`PreparedEnv.library_env`),
and a ``.pth`` hook takes that folder off ``LD_LIBRARY_PATH`` again at start-up, so the
task's own programs, started by the agent, never load the host's libraries.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prefect_harbor.config import ConfigurationError

#: The interpreter this one's virtual environment was made from (CPython's, not in typeshed).
_BASE_PYTHON: str = sys._base_executable  # type: ignore[attr-defined]

_COMPLETE_MARKER = ".prefect-harbor-complete"
#: glibc's own libraries: the image's glibc must serve them, never a copy of the host's.
_GLIBC = ("ld-linux", "libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "libresolv.so", "libutil.so", "libanl.so", "linux-vdso")
#: The interpreter's own extension modules that no agent or grader loads (Tk pulls in X11).
_UNUSED_MODULES = ("_tkinter",)
_HOOK = "_prefect_harbor_hostlibs.pth"


class EnvironmentBuildError(ConfigurationError):
    """Installing an environment's requirements failed (the message carries uv's output)."""


def cache_root() -> Path:
    """Where bundles and prepared environments are cached (``PREFECT_HARBOR_CACHE`` overrides)."""
    configured = os.environ.get("PREFECT_HARBOR_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (base / "prefect-harbor").resolve()


def uv_binary() -> Path:
    """The real ``uv`` executable (not a shell shim, which would not work inside a sandbox)."""
    try:
        import uv

        found: Path | None = Path(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        on_path = shutil.which("uv")
        found = Path(on_path) if on_path else None
    if found is None or not found.is_file():
        raise ConfigurationError("uv is not installed: install it with `pip install uv` (bundles are built and installed with uv).")
    return found.resolve()


@dataclass(frozen=True)
class PreparedEnv:
    """A virtual environment on the host that sandboxes mount read-only at the same path."""

    path: Path
    base_prefix: Path
    uv: Path
    libs: Path | None = None

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def mounts(self) -> list[dict]:
        """Harbor ``EnvironmentConfig.mounts`` entries that make the environment usable inside."""
        paths = [self.base_prefix, self.path, self.uv, *([self.libs] if self.libs else [])]
        return [{"type": "bind", "source": str(p), "target": str(p), "read_only": True} for p in paths]

    def baked(self) -> list[dict]:
        """What ``patch_dockerfile_with_sdk`` copies into a task image: ``{"source", "target"}`` pairs.

        The same paths as :meth:`mounts`, except that the interpreter comes from a trimmed,
        hard-linked view of its prefix (no test suite, static library or IDLE: 187 of its
        346 MB here) that lands at the interpreter's own path.
        """
        trimmed = trimmed_prefix(self.base_prefix, self.path.parent.parent / "pythons")
        pairs = [(trimmed, self.base_prefix), *((p, p) for p in (self.path, self.uv, *([self.libs] if self.libs else [])))]
        return [{"source": str(source), "target": str(target)} for source, target in pairs]

    def library_env(self) -> dict[str, str]:
        """What a process running this environment's Python needs in its environment (see the module docstring)."""
        return {"LD_LIBRARY_PATH": str(self.libs)} if self.libs else {}


def prepare_env(
    requirements: Sequence[str], *, root: Path | None = None, logger: logging.Logger | logging.LoggerAdapter | None = None
) -> tuple[PreparedEnv, bool]:
    """The environment holding ``requirements``, built now or reused; returns it and whether it was cached.

    Content-addressed by the requirements, the interpreter and uv's version, so two
    bundles with the same dependencies share one environment. Concurrent callers wait on
    a file lock instead of building twice; a half-built environment is rebuilt.
    """
    log = logger or logging.getLogger(__name__)
    uv = uv_binary()
    base_prefix = Path(sys.base_prefix).resolve()
    key = _key(list(requirements), base_prefix, uv)
    envs = (root or cache_root()) / "envs"
    envs.mkdir(parents=True, exist_ok=True)
    target = envs / key
    env = PreparedEnv(path=target, base_prefix=base_prefix, uv=uv, libs=runtime_libraries(base_prefix, envs.parent / "hostlibs"))
    with open(envs / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _COMPLETE_MARKER).is_file():
            log.info(f"Reusing the prepared environment {target} ({len(requirements)} requirements)")
            return env, True
        shutil.rmtree(target, ignore_errors=True)
        log.info(f"Preparing an environment with {len(requirements)} requirements at {target}")
        # Built in place: a virtual environment's scripts name its own absolute path.
        _uv(uv, ["venv", "--quiet", "--python", _BASE_PYTHON, str(target)], "creating the environment")
        if requirements:
            requirements_file = target / "requirements.txt"
            requirements_file.write_text("\n".join(requirements) + "\n")
            # Bytecode is compiled now, once: sandboxes mount the environment read-only, where
            # Python cannot cache it, and would otherwise recompile on every start (litellm: ~10 s).
            install = ["pip", "install", "--quiet", "--compile-bytecode", "--python", env.python, "-r", str(requirements_file)]
            _uv(uv, install, f"installing {', '.join(requirements)}")
        _install_library_hook(target, env.libs)
        (target / _COMPLETE_MARKER).write_text(json.dumps({"requirements": list(requirements)}))
    return env, False


def runtime_libraries(base_prefix: Path, root: Path) -> Path:
    """A folder with the non-glibc shared libraries this interpreter loads, copied from the host once."""
    python = Path(_BASE_PYTHON).resolve()
    modules = sorted(p for p in (base_prefix / "lib").glob("python3*/lib-dynload/*.so") if not p.name.startswith(_UNUSED_MODULES))
    needed: dict[str, Path] = {}
    for binary in [python, *modules]:
        listed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
        for line in listed.splitlines():
            name, _, rest = line.strip().partition(" => ")
            resolved = Path(rest.split(" (", 1)[0]) if rest.startswith("/") else None
            if resolved and not name.startswith(_GLIBC) and not resolved.is_relative_to(base_prefix):
                needed[name] = resolved.resolve()
    material = json.dumps(sorted((name, str(path), path.stat().st_size) for name, path in needed.items()))
    def copy_libraries(staging: Path) -> None:
        staging.mkdir()
        for name, path in needed.items():
            shutil.copy2(path, staging / name)

    return _made_once(root / hashlib.sha256(material.encode()).hexdigest()[:16], copy_libraries)


def trimmed_prefix(base_prefix: Path, root: Path) -> Path:
    """A hard-linked copy of the interpreter's prefix without what no trial runs (made once)."""
    skipped = shutil.ignore_patterns("test", "tests", "idlelib", "turtledemo", "ensurepip", "config-3*", "*.a")

    def link_prefix(staging: Path) -> None:
        shutil.copytree(base_prefix, staging, symlinks=True, ignore=skipped, copy_function=_link_or_copy)

    return _made_once(root / hashlib.sha256(f"{base_prefix}:{sys.version}".encode()).hexdigest()[:16], link_prefix)


def _made_once(target: Path, make: Callable[[Path], None]) -> Path:
    """``target``, made by ``make`` into a staging folder and renamed into place (by one process, once)."""
    if target.is_dir():
        return target
    staging = target.parent / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    make(staging)
    try:
        staging.rename(target)
    except OSError:  # another process made it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _install_library_hook(venv: Path, libs: Path | None) -> None:
    """A ``.pth`` line that drops ``libs`` from ``LD_LIBRARY_PATH`` once the interpreter has started."""
    if libs is None:
        return
    line = (
        f"import os; _kept = [p for p in os.environ.get('LD_LIBRARY_PATH', '').split(':') if p and p != {str(libs)!r}]; "
        "os.environ.update(LD_LIBRARY_PATH=':'.join(_kept)) if _kept else os.environ.pop('LD_LIBRARY_PATH', None)\n"
    )
    for site_packages in venv.glob("lib/python3*/site-packages"):
        (site_packages / _HOOK).write_text(line)


def _key(requirements: list[str], base_prefix: Path, uv: Path) -> str:
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=False).stdout.strip()
    material = json.dumps({"requirements": requirements, "python": str(base_prefix), "version": sys.version, "uv": version, "bytecode": True, "library_hook": 1})
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def _uv(uv: Path, args: list[str], what: str) -> None:
    completed = subprocess.run([str(uv), *args], capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        output = (completed.stderr or completed.stdout).strip()[-2000:]
        raise EnvironmentBuildError(f"{what} failed (uv exit {completed.returncode}):\n{output}")
