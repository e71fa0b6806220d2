"""A container's working folder made at start when its image lacks it, as Docker does.

``docker run -w DIR`` creates a missing ``DIR`` (root's, mode 0755); podman 4.3 refuses to
start the container (``workdir "DIR" does not exist on container``), leaving it created but
not running. A task's ``[environment] workdir`` or a compose service's ``working_dir`` is
often a folder only a later step fills. So when podman refuses, the folder is copied into
the stopped container (an archive holding that one empty folder, through podman's own
copier, which resolves the path inside the container) and the container is started again.
"""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import PurePosixPath

from prefect_harbor.sandbox.engine import STATE_CALL_TIMEOUT_SEC, Completed, podman
from prefect_harbor.sandbox.transfer import put_archive

_MISSING = re.compile(rb'workdir "(?P<path>[^"]+)" does not exist on container')


def missing_workdir(failed: Completed) -> str | None:
    """The working folder podman refused to start a container in because the image lacks it, if that is why it failed."""
    match = _MISSING.search(failed.stderr) if failed.returncode != 0 else None
    path = match["path"].decode(errors="replace") if match else None
    return path if path and path.startswith("/") else None


async def start_creating_workdir(container: str, failed: Completed) -> Completed | None:
    """If ``failed`` is podman refusing to start ``container`` in a folder its image lacks, create the
    folder and start it again: that start's result. None when ``failed`` failed for another reason;
    :class:`EngineError` when the folder cannot be made."""
    workdir = missing_workdir(failed)
    if workdir is None:
        return None
    await put_archive(container, _folders_archive(workdir), f"making the working folder {workdir} in {container}")
    return await podman("start", container, timeout=STATE_CALL_TIMEOUT_SEC)


def _folders_archive(path: str) -> bytes:
    """A tar stream holding ``path`` as an empty folder (root's, mode 0755). Only the folder
    itself: its missing parents are made on the way, while an entry for an existing parent
    would reset that folder's owner and mode (``/home/agent`` would become root's)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        member = tarfile.TarInfo(str(PurePosixPath(path).relative_to("/")))
        member.type, member.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(member)
    return buffer.getvalue()
