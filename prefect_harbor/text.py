"""Text a trial controls, shown as text: control characters made visible, never obeyed by a terminal.

A task's verifier, its image build and its agent print what they like, and the sweep repeats
some of it: a row's messages, a build log's tail, the verifier's last lines, file names. Sent
raw to a terminal, ``ESC ] 0 ; … BEL`` retitles it, ``ESC [ 2 J`` clears it, ``ESC ] 52`` writes
the clipboard, ``ESC ] 8`` hides a link's target, and a cursor move or a bare carriage return
writes over an earlier line (a "reward 1" forged). :func:`visible` shows each such character as
``\\x1b``-style text instead; printable text, non-ASCII letters and emoji included, is kept.

Applied where the sweep shows text, not where it stores it:

- every log record while a flow runs (:func:`visible_logs`, on every handler: Prefect's API
  handler and its console alike, whichever logger the record came from);
- Prefect artifacts (:func:`visible_values`) and a row's task-run state message;
- the command line's console (:class:`prefect_harbor.cli.console.VisibleConsole`).

The results (``results.parquet``, ``summary.json``), ``diagnostics.json`` and the archives are
data and keep the text as the trial wrote it (within ``bounds.py``): a program reading them gets
the exact bytes, and whatever prints them to a terminal shows them through :func:`visible`, as
the command line does.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect_harbor.log_filters import on_every_handler

#: What a terminal obeys rather than shows: C0 controls but tab and newline, DEL, and C1 controls
#: (U+0080-U+009F; U+009B alone is a CSI to terminals that read C1 codes).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with every control character shown as ``\\xNN`` (ESC as ``\\x1b``); tabs and newlines kept,
    a Windows line end (``\\r\\n``) read as a newline."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(_shown, text.replace("\r\n", "\n"))


def _shown(control: re.Match[str]) -> str:
    return f"\\x{ord(control.group()):02x}"


def visible_values(value: Any) -> Any:
    """Every string in ``value`` (an artifact's rows: mappings, lists, their keys too) through :func:`visible`."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible_values(key): visible_values(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [visible_values(child) for child in value]
    return value


class VisibleControls(logging.Filter):
    """Shows the control characters of a record's message and traceback, before any handler formats or ships it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - arguments that do not fit the message: the handler reports it, as logging does
            return True
        if (shown := visible(message)) != message:
            record.msg, record.args = shown, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = visible(record.exc_text)
        return True


@contextmanager
def visible_logs() -> Iterator[None]:
    """Control characters shown in every log record handled while the block runs (:class:`VisibleControls`)."""
    with on_every_handler(VisibleControls()):
        yield
