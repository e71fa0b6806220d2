"""The build context of a stand-in for ``ghcr.io/astral-sh/uv:<version>``.

The real image is distroless: ``/uv`` and ``/uvx`` and nothing else, copied into task images
with ``COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/``. uv's wheel on PyPI carries
the same release's binaries, so the stand-in is built from that wheel, installed with the
project's own uv (which honours the host's index, proxy and certificate settings). When the
wheel cannot be had, the project's own uv binaries stand in, and the warning says which
version that is. The PyPI binaries link to glibc (the image's are static): they run in
Debian and Ubuntu images, not in Alpine ones.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The stand-in image: the two binaries at the root, as in the real one.
DOCKERFILE = "FROM scratch\nCOPY uv uvx /\n"


def uv_context(version: str | None, cache: Path) -> tuple[Path, str]:
    """A build context holding uv ``version``'s binaries (the newest for None), made once under
    ``cache``; returns the folder and what it holds, for the stand-in's warning.

    A release that cannot be had is not remembered: the next process asks PyPI again."""
    import uv

    folder = cache / f"uv-{version or 'latest'}"
    if not (folder / "Dockerfile").is_file():
        requirement = f"uv=={version}.*" if version and version.count(".") == 1 else f"uv=={version}" if version else "uv"
        with tempfile.TemporaryDirectory(prefix="uv-wheel-") as scratch:
            problem = _install(requirement, Path(scratch))
            if problem is not None:
                own = Path(uv.find_uv_bin())
                fallback = _publish(own.parent, cache / f"uv-own-{_version_of(own)}")
                return fallback, (
                    f"the project's own uv {_version_of(own)} as /uv and /uvx, NOT the tag's {version or 'latest'}: "
                    f"{requirement} could not be had from PyPI ({problem})"
                )
            _publish(Path(scratch, "bin"), folder)
    return folder, f"uv {_version_of(folder / 'uv')}'s /uv and /uvx from its PyPI wheel (glibc-linked, where the image's are static)"


def _install(requirement: str, target: Path) -> str | None:
    """Install uv's wheel into ``target`` with the project's own uv (its binaries land in ``target/bin``); why not, or None."""
    import uv

    installed = subprocess.run(
        [uv.find_uv_bin(), "pip", "install", "--quiet", "--no-deps", "--python", sys.executable, "--target", str(target), requirement],
        capture_output=True, text=True, timeout=600, env={**os.environ, "UV_NO_PROGRESS": "1"},
    )  # fmt: skip
    if installed.returncode != 0:
        return ((installed.stderr or installed.stdout).strip().splitlines() or ["uv failed"])[-1].strip()
    if not all((target / "bin" / name).is_file() for name in ("uv", "uvx")):
        return "its wheel holds no uv and uvx binaries"
    return None


def _publish(binaries: Path, folder: Path) -> Path:
    """``folder`` as the stand-in's build context (``uv``, ``uvx``, the Dockerfile), made whole or not at all."""
    if (folder / "Dockerfile").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{folder.name}-", dir=folder.parent) as scratch:
        made = Path(scratch, "context")
        made.mkdir()
        for name in ("uv", "uvx"):
            shutil.copy2(binaries / name, made / name)
        (made / "Dockerfile").write_text(DOCKERFILE)
        try:
            made.rename(folder)
        except OSError:  # another process made it first: theirs is as good
            if not (folder / "Dockerfile").is_file():
                raise
    return folder


def _version_of(binary: Path) -> str:
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout.split()[1] if done.returncode == 0 and len(done.stdout.split()) > 1 else "(unknown version)"
