"""Folders only this user may read or write: where the sandbox keeps what others must not see or change.

A name under a shared folder (the system's temporary folder) can be made first by anyone, as a
link or a folder of their own; such a folder is refused, never used.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class PrivateFolderError(RuntimeError):
    """A folder that should be this user's alone is a link or another user's; the message says to remove it."""


def private_folder(folder: Path, purpose: str) -> Path:
    """``folder`` made, or kept, mode 0700; refused if it is a link or belongs to another user."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = folder.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
        raise PrivateFolderError(f"{folder} is a link or belongs to another user: remove it ({purpose} is kept there).")
    if info.st_mode & 0o077:
        folder.chmod(0o700)
    return folder
