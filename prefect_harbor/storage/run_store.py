"""One sweep run's folder in object storage, written so that nothing finished is lost.

Layout under the results root (a local path or any fsspec URL)::

    <root>/<run_id>/manifest.json              configuration (secrets redacted), versions,
                                               dataset fingerprint, start/end, final state
    <root>/<run_id>/parts/part-000042.parquet  one file per finished row, written at once
    <root>/<run_id>/results.parquet            all rows, compacted when the run ends
    <root>/<run_id>/<trial_name>/...           each attempt's archive: Harbor's trial folder (logs, result.json,
                                               artifacts, diagnostics); archives/<row>/ in runs before attempts
    <root>/<run_id>/config.json, result.json   the run as a Harbor job (JobConfig, JobResult: ``harbor view``)
    <root>/<run_id>/summary.json               the run's summary and statistics
    <root>/<run_id>/status.json, heartbeat.json live row statuses, the sweep's last sign of life (control.py)

:class:`RunStore` puts the pieces together: whole, retried writes with a local fallback
(``durable.py``), the manifest (``manifest.py``), the spool the results table is compacted
from (``spool.py``), and reads that survive damaged files (``reading.py``).
"""

from __future__ import annotations

import copy
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from prefect_harbor.storage.durable import DurableFolder, StorageUnavailable
from prefect_harbor.storage.manifest import RunManifest, now, package_versions
from prefect_harbor.storage.reading import DamagedFile, read_manifest, read_results, read_table
from prefect_harbor.storage.results import RowResult, to_table
from prefect_harbor.storage.spool import RowSpool

__all__ = [
    "DamagedFile", "RunManifest", "RunStore", "StorageUnavailable", "now", "package_versions", "run_folder_of_flow_run", "split_run_folder",
]  # fmt: skip


class RunStore(DurableFolder):
    """Reads and writes one run's folder; see the module docstring for the layout."""

    def __init__(self, root: str, run_id: str, fallback_dir: Path, **options: Any):
        """As :class:`DurableFolder` (``storage_options``, ``logger``, ``retry_delays``)."""
        super().__init__(root, run_id, fallback_dir, **options)
        #: What reading found damaged, in words (``status`` prints it).
        self.damaged: list[str] = []
        #: Every row this store wrote: ``finalize`` compacts the results table from it.
        self.spool = RowSpool(fallback_dir.with_name(f"{fallback_dir.name}-rows.arrows"))

    def __getstate__(self) -> dict:
        """Shipped to another process (a Dask worker) without the flow run's logger."""
        return {**self.__dict__, "logger": logging.getLogger(__name__)}

    @property
    def spool_path(self) -> Path:
        return self.spool.path

    # ---------------------------------------------------------------- the write path

    def write_manifest(self, manifest: RunManifest) -> str:
        manifest.local_fallback = str(self.fallback_dir) if self.unsent else None
        manifest.unsent_files = list(self.unsent)
        return self.write_bytes("manifest.json", manifest.model_dump_json(indent=2).encode())

    def write_row(self, result: RowResult) -> str:
        """Persist one finished row at once, so a crash later loses nothing."""
        return self.write_rows([result])

    def write_rows(self, results: list[RowResult]) -> str:
        """Persist finished rows as one part, named by the rows (and attempts after the first) it holds."""
        first, last = _part_key(results[0]), _part_key(results[-1])
        name = f"part-{first}" if first == last else f"part-{first}-{last}"
        table = to_table(results)
        self.spool.add(table)
        return self.write_bytes(f"parts/{name}.parquet", _parquet_bytes(table))

    def rows_so_far(self) -> pa.Table:
        """Every row this store has written (a resumed run's kept rows included), read locally: the storage may be away."""
        return self.spool.snapshot()

    def finalize(self) -> str:
        """Write every row this store wrote into ``results.parquet``, in row order, then drop the
        parts it replaces. Holds the rows in columnar form only for this step."""
        return self.compact()[0]

    def compact(self) -> tuple[str, pa.Table]:
        """:meth:`finalize`, returning the table it wrote too (the run's statistics are computed from it)."""
        self.push_unsent()
        rows = self.spool.drain().sort_by([("row_index", "ascending"), ("attempt", "ascending")])
        location = self.write_bytes("results.parquet", _parquet_bytes(rows))
        self.spool.remove()
        if "results.parquet" not in self.unsent:
            try:
                self._retry(lambda: self.fs.rm(f"{self.run_path}/parts", recursive=True), "remove parts")
            except (StorageUnavailable, FileNotFoundError):
                self.logger.warning(f"Could not remove {self.uri('parts')}; results.parquet holds every row")
        return location, rows

    def gather_parts(self) -> list[RowResult]:
        """A sweep on many hosts: each host wrote its rows as parts, so what :meth:`compact` writes
        is what the parts hold, not what this process spooled."""
        rows = self.read_results()
        self.spool.drain()
        self.spool.remove()
        self.spool = RowSpool(self.spool.path)
        if rows:
            self.spool.add(to_table(sorted(rows, key=lambda r: (r.row_index, r.attempt))))
        return rows

    # ---------------------------------------------------------------- the read path

    def read_results(self) -> list[RowResult]:
        """Every row already recorded; a damaged file is named in a warning (and in ``damaged``)."""
        return read_results(self, self.damaged)

    def read_table(self) -> pa.Table:
        """:meth:`read_results` as an Arrow table, for statistics over many rows."""
        return read_table(self, self.damaged)

    def read_manifest(self) -> RunManifest:
        """The run's manifest; ``DamagedFile`` when it cannot be parsed, ``FileNotFoundError`` when absent."""
        return read_manifest(self)

    @classmethod
    def open(cls, run_url: str, storage_options: dict[str, Any] | None = None) -> RunStore:
        """The store of an existing run folder, e.g. ``results/20261129T181500Z-1a2b3c4d``."""
        root, run_id = split_run_folder(run_url)
        return cls(root, run_id, fallback_dir=Path(tempfile.gettempdir()) / "prefect-harbor" / "unsent" / run_id, storage_options=storage_options)

    @classmethod
    def runs_under(cls, root: str, storage_options: dict[str, Any] | None = None) -> list[RunStore]:
        """A store for each run folder under ``root``, all on one connection: for reads and ``write_now``."""
        anchor = cls.open(f"{root.rstrip('/')}/_", storage_options)
        root_path = anchor.run_path.rpartition("/")[0]
        try:
            entries = anchor.fs.ls(root_path, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        stores = []
        for entry in entries:
            if entry["type"] == "directory":
                store = copy.copy(anchor)
                store.run_id = entry["name"].rstrip("/").rsplit("/", 1)[-1]
                store.run_path, store.unsent, store.damaged = f"{root_path}/{store.run_id}", [], []
                stores.append(store)
        return stores

    # ---------------------------------------------------------------- resume

    def restart_from(self, kept: list[RowResult], dropped: Sequence[RowResult] = ()) -> None:
        """Drop the recorded rows a resumed run will redo, with their archives (and old control
        requests, already answered); keep ``kept`` as one part."""
        for relative in ("results.parquet", "parts", "control"):
            if self.fs.exists(f"{self.run_path}/{relative}"):
                self.fs.rm(f"{self.run_path}/{relative}", recursive=True)
        for result in dropped:
            folder = self.relative_path(result.artifact_uri)
            if folder and self.fs.exists(f"{self.run_path}/{folder}"):
                self.fs.rm(f"{self.run_path}/{folder}", recursive=True)
        if kept:
            self.write_rows(sorted(kept, key=lambda r: (r.row_index, r.attempt)))

    def relative_path(self, uri: str | None) -> str | None:
        """``uri``'s path inside this run folder (``<trial>``, ``archives/<row>``), or None when it is not in it."""
        if not uri:
            return None
        prefix = self.uri() + "/"
        return uri[len(prefix):].strip("/") or None if uri.startswith(prefix) else None


def run_folder_of_flow_run(root: str, flow_run_id: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """The run folder under ``root`` that flow run ``flow_run_id`` wrote (its run id ends with the
    id's first 8 characters; its manifest names it), or None: how a Retry finds its own run."""
    fs, path = fsspec.core.url_to_fs(root, **(storage_options or {}))
    for folder in sorted(fs.glob(f"{path.rstrip('/')}/*-{flow_run_id[:8]}")):
        try:
            manifest = RunManifest.model_validate_json(fs.cat_file(f"{folder}/manifest.json"))
        except (OSError, ValueError):
            continue
        if manifest.flow_run_id == flow_run_id:
            return fs.unstrip_protocol(folder) if "://" in root else folder
    return None


def split_run_folder(run_folder: str) -> tuple[str, str]:
    """``<root>/<run_id>`` split into its results root and run id."""
    root, _, run_id = run_folder.rstrip("/").rpartition("/")
    return root or ".", run_id


def _part_key(result: RowResult) -> str:
    """``000042``: a row's position; ``000042a2`` for its second attempt."""
    return f"{result.row_index:06d}" + ("" if result.attempt == 1 else f"a{result.attempt}")


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()
