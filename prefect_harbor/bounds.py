"""How much of what a trial writes a sweep reads and repeats.

The agent decides what its verifier writes (and a task's verifier may be careless), so these
are ceilings on the sweep's memory, on the results table and on what reaches logs, archives
and the Prefect API:

* a reward file is read only up to :data:`REWARD_FILE_BYTES`, and ``reward.json`` only up to
  :data:`REWARD_KEYS` keys (:mod:`prefect_harbor.trial.bounded_verifier`); past either the row
  is a ``verifier_error`` saying which bound and by how much;
* a row's messages (``err_message``, ``archive_error``), and so its log line, task-run state
  and ``diagnostics.json``, are at most :data:`MESSAGE_CHARS`: the end of the text, which says
  how much was cut before it (:func:`bounded`);
* the verifier's printed output is read from its end, at most :data:`OUTPUT_TAIL_BYTES` (:func:`read_tail`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MiB = 1 << 20
#: The most of ``reward.json`` or ``reward.txt`` a sweep reads.
REWARD_FILE_BYTES = MiB
#: The most keys a ``reward.json`` may hold.
REWARD_KEYS = 1000
#: The longest message a row carries (4 KiB).
MESSAGE_CHARS = 4096
#: The most of a verifier's printed output read to say why it failed.
OUTPUT_TAIL_BYTES = 64 * 1024


def bounded(text: str | None, limit: int = MESSAGE_CHARS) -> str | None:
    """``text``, or its last characters when it is longer than ``limit``, after a note of how many were cut."""
    if text is None or len(text) <= limit:
        return text
    tail = text[-(limit - 64) :]
    return f"[{len(text) - len(tail):,} characters cut] …{tail}"


def read_tail(path: Path, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of the regular file at ``path``, as text ("" when unreadable); never follows a link."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(handle, "rb") as source:
        found = os.fstat(source.fileno())
        if not stat.S_ISREG(found.st_mode):
            return ""
        size = found.st_size
        source.seek(max(0, size - limit))
        return source.read(limit).decode(errors="replace")
