"""Per-row archives, the Osmosis way: scrub the trial tree, then keep its logs.

Order matters: every secret is scrubbed from the local trial tree BEFORE anything is
copied out, and the scrub fails closed — if a file cannot be scrubbed and verified, the
whole tree is deleted and the row says so. Symlinks are never followed or copied.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect_harbor.results import RowResult
from prefect_harbor.rows import path_safe
from prefect_harbor.storage import RunStore, redact

REDACTED = b"[REDACTED]"
#: What the archive keeps of a Harbor trial directory (relative paths; folders recurse).
KEPT = ("trial.log", "exception.txt", "result.json", "config.json", "agent", "verifier", "artifacts")


class ScrubFailed(Exception):
    """A trial tree could not be verified free of secrets; it has been deleted."""


@dataclass
class ArchiveReport:
    uri: str | None = None
    files: int = 0
    scrubbed_files: list[str] = field(default_factory=list)
    error: str | None = None


def scrub_tree(root: Path, secrets: list[str]) -> list[str]:
    """Replace every secret in every regular file under ``root``; return what changed.

    Fails closed: any file that cannot be read, rewritten and re-checked makes the whole
    tree be deleted and :class:`ScrubFailed` raised.
    """
    needles = [secret.encode() for secret in secrets if secret]
    changed: list[str] = []
    if not needles or not root.exists():
        return changed
    try:
        for path in _regular_files(root):
            data = path.read_bytes()
            if not any(needle in data for needle in needles):
                continue
            for needle in needles:
                data = data.replace(needle, REDACTED)
            path.write_bytes(data)
            if any(needle in path.read_bytes() for needle in needles):
                raise OSError(f"{path} still holds a secret after scrubbing")
            changed.append(str(path.relative_to(root)))
    except OSError as error:
        shutil.rmtree(root, ignore_errors=True)
        raise ScrubFailed(f"could not scrub {root} ({error}); deleted it rather than keep a secret") from error
    return changed


def _regular_files(root: Path):
    """Regular files under ``root``, never following a symlink (to a file or a folder)."""
    for directory, folders, files in os.walk(root, followlinks=False):
        for name in files:
            path = Path(directory, name)
            if not path.is_symlink() and path.is_file():
                yield path
        folders[:] = [f for f in folders if not Path(directory, f).is_symlink()]


def diagnostics(result: RowResult) -> dict[str, Any]:
    """What failed where, and how long each phase took (Osmosis diagnostics.json)."""
    return {
        "backend": "harbor",
        "row_id": result.row_id,
        "status": result.status,
        "phase": result.err_phase,
        "harbor_exception_type": result.exception_type,
        "category": result.err_category,
        "message": result.err_message,
        "timings_sec": {
            "environment_setup": result.environment_setup_sec,
            "agent_setup": result.agent_setup_sec,
            "agent": result.agent_sec,
            "verifier": result.verifier_sec,
            "total": result.total_sec,
        },
    }


def archive_row(result: RowResult, trial_dir: Path | None, store: RunStore, secrets: list[str]) -> ArchiveReport:
    """Scrub ``trial_dir`` and copy what the archive keeps to ``archives/<row>/``."""
    folder = f"archives/{archive_name(result.row_id)}"
    report = ArchiveReport(uri=store.uri(folder))
    if trial_dir is not None and trial_dir.exists():
        try:
            report.scrubbed_files = scrub_tree(trial_dir, secrets)
        except ScrubFailed as error:
            report.error = str(error)
        else:
            for relative, path in _kept_files(trial_dir):
                store.write_bytes(f"{folder}/{relative}", path.read_bytes())
                report.files += 1
            trajectory = trial_dir / "agent" / "trajectory.json"
            if trajectory.is_file() and not trajectory.is_symlink():
                store.write_bytes(f"{folder}/trajectory.json", trajectory.read_bytes())
                report.files += 1
    details = redact(diagnostics(result), secrets)
    if report.error:
        details["archive_error"] = report.error
    store.write_bytes(f"{folder}/diagnostics.json", json.dumps(details, indent=2).encode())
    report.files += 1
    return report


def _kept_files(trial_dir: Path):
    for name in KEPT:
        path = trial_dir / name
        if path.is_symlink():
            continue
        if path.is_file():
            yield name, path
        elif path.is_dir():
            for file in _regular_files(path):
                yield str(file.relative_to(trial_dir)), file


def archive_name(row_id: str) -> str:
    """A folder name for the row: its id when that is path-safe, else a safe form plus a hash."""
    safe = path_safe(row_id, limit=200)
    if safe == row_id:
        return safe
    return f"{safe[:80]}-{hashlib.sha256(row_id.encode()).hexdigest()[:8]}"
