"""Files in and out of a container as tar streams, read and written on the host by Python.

Inside the container only ``tar`` runs; on the host, extraction uses Harbor's
``transfer_tar_filter`` (the standard library's ``data`` filter, device files skipped),
except that a member the filter refuses -- an absolute symlink, a link or path leading out
of the target -- is skipped and logged instead of aborting the whole transfer. So a
symlink an agent plants in ``/logs`` can neither make the host write or read outside the
trial, nor cost the trial its logs.
"""

from __future__ import annotations

import logging
import tarfile
from pathlib import Path
from typing import IO

from harbor.environments.base import transfer_tar_filter

logger = logging.getLogger(__name__)


def pack(source: Path, arcname: str, into: IO[bytes]) -> None:
    """Write ``source`` (a file or a directory tree) as ``arcname``, owned by root, links kept as links."""

    def as_root(member: tarfile.TarInfo) -> tarfile.TarInfo:
        member.uid = member.gid = 0
        member.uname = member.gname = "root"
        return member

    with tarfile.open(fileobj=into, mode="w") as archive:
        archive.add(str(source), arcname=arcname, recursive=True, filter=as_root)


def unpack(archive_file: IO[bytes], target: Path, *, only: str | None = None, rename_to: str | None = None) -> list[str]:
    """Extract into ``target``; the names of members skipped as unsafe.

    ``only``/``rename_to`` pick one regular file out of the archive and write it as
    ``target/rename_to`` (for single-file downloads).
    """
    skipped: list[str] = []
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=archive_file, mode="r|") as archive:
        for member in archive:
            if only is not None:
                if member.name.lstrip("./") != only or not member.isfile():
                    continue
                member.name = rename_to or only
            try:
                safe = transfer_tar_filter(member, str(target))
            except tarfile.FilterError as error:
                skipped.append(f"{member.name} ({error})")
                continue
            if safe is None:
                continue
            try:
                archive.extract(safe, str(target), filter=lambda m, _dest: m)
            except (OSError, tarfile.TarError) as error:
                skipped.append(f"{member.name} ({error})")
    if skipped:
        logger.warning(f"Skipped {len(skipped)} unsafe or unwritable entries while copying into {target}: {skipped[:5]}")
    return skipped
