"""Per-row archives, the Osmosis way: scrub the trial tree, bound it, then keep its logs.

Order matters: every secret is scrubbed from the local trial tree, in file contents and in
file names, BEFORE anything is copied out, and the scrub fails closed: if a file cannot be
scrubbed and verified, the whole tree is deleted and the row says so. Symlinks are never
followed or copied.

The agent decides how much it writes, so nothing here holds a file in memory: files are
scanned, scrubbed and uploaded in chunks, and each row's archive is bounded by
:class:`ArchiveLimits` (files over a limit are cut or skipped, and listed in the archive's
``manifest.json``; ``diagnostics.json`` counts inside the row's budget). The agent also names
its files, so each is stored under a name every store can hold (:mod:`.archive_names`), its
original name beside it in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from prefect_harbor.rows.dataset import path_safe
from prefect_harbor.secrets import REDACTED, Redactor
from prefect_harbor.storage.archive_names import KEY_BYTES, storable
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore

MiB = 1 << 20
#: What the archive keeps of a Harbor trial directory (relative paths; folders recurse), in the
#: order the row's byte budget is spent: the small files that say what happened come first.
KEPT = ("result.json", "config.json", "exception.txt", "trial.log", "sandbox", "verifier", "agent", "artifacts")
CHUNK = MiB


@dataclass(frozen=True)
class ArchiveLimits:
    """How much of a trial tree one row may keep (the backend's ``archive_max_*_mb`` fields)."""

    file_bytes: int = 50 * MiB
    row_bytes: int = 500 * MiB


class ScrubFailed(Exception):
    """A trial tree could not be verified free of secrets; it has been deleted."""


@dataclass
class TreeReport:
    """What preparing a trial tree changed: names and files scrubbed, files cut or dropped."""

    scrubbed: list[str] = field(default_factory=list)
    cut: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ArchiveReport:
    uri: str | None = None
    files: int = 0
    bytes: int = 0
    tree: TreeReport = field(default_factory=TreeReport)
    error: str | None = None


def prepare_tree(root: Path, redactor: Redactor, limits: ArchiveLimits = ArchiveLimits(), reserved: int = 0) -> TreeReport:
    """Make ``root`` safe and bounded in place: secrets out of names and contents, files over
    the limits cut (per file) or removed (once the row's budget, less ``reserved`` bytes, is spent).

    Fails closed: any file that cannot be handled makes the whole tree be deleted and
    :class:`ScrubFailed` raised.
    """
    report = TreeReport()
    if not root.exists():
        return report
    try:
        if redactor:
            _scrub_names(root, redactor, report)
        remaining = limits.row_bytes - reserved
        needles = redactor.needles()
        for path in _ordered_files(root):
            relative = str(path.relative_to(root))
            size = path.stat().st_size
            allowance = min(limits.file_bytes, remaining)
            if allowance <= 0:
                path.unlink()
                report.skipped.append({"path": relative, "bytes": size, "why": f"the row's {limits.row_bytes // MiB} MiB were spent"})
                continue
            if size > allowance:
                os.truncate(path, allowance)
                report.cut.append({"path": relative, "bytes": size, "kept_bytes": allowance})
            remaining -= min(size, allowance)
            if needles and _scrub_file(path, needles):
                report.scrubbed.append(relative)
    except OSError as error:
        shutil.rmtree(root, ignore_errors=True)
        raise ScrubFailed(f"could not scrub {root} ({error}); deleted it rather than keep a secret") from error
    return report


def _scrub_names(root: Path, redactor: Redactor, report: TreeReport) -> None:
    """Rename every file and folder whose name holds a secret (top-down, so children follow)."""
    for directory, folders, files in os.walk(root, followlinks=False):
        for names, is_folder in ((folders, True), (files, False)):
            for position, name in enumerate(names):
                if redactor.holds_secret(name):
                    new = _free_name(Path(directory), redactor.text(name))
                    os.rename(Path(directory, name), Path(directory, new))
                    report.scrubbed.append(str(Path(directory, new).relative_to(root)) + ("/" if is_folder else ""))
                    names[position] = new
        folders[:] = [f for f in folders if not Path(directory, f).is_symlink()]


def _free_name(directory: Path, name: str) -> str:
    candidate, number = name, 1
    while (directory / candidate).exists():
        candidate, number = f"{name}-{number}", number + 1
    return candidate


def _scrub_file(path: Path, needles: list[bytes]) -> bool:
    """Rewrite ``path`` without ``needles`` if it holds one (streamed, via a sibling temp file)."""
    with _open_regular(path) as source:
        if not _contains(source, needles):
            return False
        source.seek(0)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".scrub-")
        with os.fdopen(fd, "wb") as target:
            for piece in _scrubbed(source, needles):
                target.write(piece)
    os.replace(temporary, path)
    with _open_regular(path) as check:
        if _contains(check, needles):
            raise OSError(f"{path} still holds a secret after scrubbing")
    return True


def _open_regular(path: Path) -> BinaryIO:
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb")


def _contains(source: BinaryIO, needles: list[bytes]) -> bool:
    overlap = max(map(len, needles)) - 1
    tail = b""
    while chunk := source.read(CHUNK):
        window = tail + chunk
        if any(needle in window for needle in needles):
            return True
        tail = window[-overlap:] if overlap else b""
    return False


def _scrubbed(source: BinaryIO, needles: list[bytes]) -> Iterator[bytes]:
    """The stream with every needle replaced, including needles split across chunks.

    A needle that straddles the end of a window starts within its last ``overlap`` bytes,
    which are held back and scanned again with the next chunk.
    """
    overlap = max(map(len, needles)) - 1
    tail = b""
    while chunk := source.read(CHUNK):
        window = tail + chunk
        for needle in needles:
            window = window.replace(needle, REDACTED.encode())
        cut = max(len(window) - overlap, 0)
        yield window[:cut]
        tail = window[cut:]
    yield tail


def _ordered_files(root: Path) -> list[Path]:
    """Regular files under ``root`` in :data:`KEPT` order, then anything else, sorted within each."""
    files = sorted(_regular_files(root), key=lambda p: str(p.relative_to(root)))
    rank = {name: position for position, name in enumerate(KEPT)}
    return sorted(files, key=lambda p: rank.get(p.relative_to(root).parts[0], len(KEPT)))


def _regular_files(root: Path) -> Iterator[Path]:
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
        "verifier_tampering": result.verifier_tampering,
        "timings_sec": {
            "environment_setup": result.environment_setup_sec,
            "agent_setup": result.agent_setup_sec,
            "agent": result.agent_sec,
            "verifier": result.verifier_sec,
            "total": result.total_sec,
        },
    }


def archive_row(
    result: RowResult, trial_dir: Path | None, store: RunStore, redactor: Redactor, limits: ArchiveLimits = ArchiveLimits()
) -> ArchiveReport:
    """Prepare ``trial_dir`` (:func:`prepare_tree`) and copy what the archive keeps to the attempt's folder (:func:`archive_folder`).

    Writes ``diagnostics.json`` always, and ``manifest.json`` (every file kept, with what was
    scrubbed, cut or skipped) when there was a tree to archive.
    """
    folder = archive_folder(result)
    uri = store.uri(folder)
    report = ArchiveReport(uri=uri)
    details = redactor.strings(diagnostics(result))
    reserved = len(json.dumps(details, indent=2).encode()) + 1024  # diagnostics.json, and the notes added to it below
    if trial_dir is not None and trial_dir.exists():
        try:
            report.tree = prepare_tree(trial_dir, redactor, limits, reserved)
        except ScrubFailed as error:
            report.error = str(error)
        else:
            budget = KEY_BYTES - len(f"{store.run_path}/{folder}/".encode())
            kept: list[dict[str, Any]] = []
            unsent = len(store.unsent)
            for relative, path in _kept_files(trial_dir):
                stored = storable(relative, budget)
                pointed = _pointing_at(path, uri) if relative == "result.json" else None
                if pointed is None:
                    store.write_file(f"{folder}/{stored}", path)
                else:
                    store.write_bytes(f"{folder}/{stored}", pointed)
                size = path.stat().st_size if pointed is None else len(pointed)
                kept.append({"path": stored, "bytes": size} | ({"original": relative} if stored != relative else {}))
            report.files, report.bytes = len(kept), sum(entry["bytes"] for entry in kept)
            manifest = {"files": kept, "limits_bytes": asdict(limits), **asdict(report.tree)}
            store.write_bytes(f"{folder}/manifest.json", json.dumps(manifest, indent=2).encode())
            details["archive"] = {key: value for key, value in asdict(report.tree).items() if value}
            if renamed := sum("original" in entry for entry in kept):
                details["archive"]["renamed"] = renamed
            if kept_locally := len(store.unsent) - unsent:
                report.error = (
                    f"{kept_locally} of the archive's files were kept locally in {store.fallback_dir} (the storage refused them); "
                    "the sweep pushes them again when it ends"
                )
    if report.error:
        details["archive_error"] = report.error
    store.write_bytes(f"{folder}/diagnostics.json", json.dumps(details, indent=2).encode())
    return report


def _pointing_at(result_json: Path, archive_uri: str) -> bytes | None:
    """Harbor's ``result.json`` with its ``trial_uri`` at the archive, where the trial now is (the
    viewer's trial page shows it; the local trial folder may be deleted); None when it cannot be read
    as Harbor's (it is kept as it is)."""
    try:
        content = json.loads(result_json.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict) or "trial_uri" not in content:
        return None
    content["trial_uri"] = archive_uri
    return json.dumps(content, indent=4).encode()


def _kept_files(trial_dir: Path) -> Iterator[tuple[str, Path]]:
    for name in KEPT:
        path = trial_dir / name
        if path.is_symlink():
            continue
        if path.is_file():
            yield name, path
        elif path.is_dir():
            for file in _regular_files(path):
                yield str(file.relative_to(trial_dir)), file
    trajectory = trial_dir / "agent" / "trajectory.json"
    if trajectory.is_file() and not trajectory.is_symlink():
        yield "trajectory.json", trajectory  # Osmosis keeps it at the archive's top too


def archive_folder(result: RowResult) -> str:
    """Where an attempt's archive goes in the run folder: its Harbor trial's name, as in a Harbor
    job folder (so ``harbor view`` finds it as a trial); ``<row>[.a<n>]__no-trial`` for an attempt
    that never reached Harbor (a bad row, a refused task, cancelled before it started)."""
    if result.trial_name:
        return path_safe(result.trial_name, limit=200)
    label = archive_name(result.row_id) + ("" if result.attempt == 1 else f".a{result.attempt}")
    return f"{label}__no-trial"


def archive_name(row_id: str) -> str:
    """A folder name for the row: its id when that is path-safe, else a safe form plus a hash."""
    safe = path_safe(row_id, limit=200)
    if safe == row_id:
        return safe
    return f"{safe[:80]}-{hashlib.sha256(row_id.encode()).hexdigest()[:8]}"
