"""Every row a run wrote, kept in a local Arrow stream, so the results table is compacted at
the end without the flow holding its rows in memory."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa

from prefect_harbor.storage.results import RESULTS_SCHEMA

#: Rows gathered in memory before they are appended to the spool as one record batch
#: (compacting 10,000 rows written one batch per row took +218 MB at its peak; 256 per batch, +37 MB).
SPOOL_BATCH = 256


class RowSpool:
    """An append-only local stream of result rows, written ``SPOOL_BATCH`` rows at a time; thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._pending: list[pa.Table] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """Shipped to another process (a Dask worker) as its path only: rows are spooled where the flow runs."""
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        RowSpool.__init__(self, state["path"])

    def add(self, table: pa.Table) -> None:
        with self._lock:
            self._pending.append(table)
            if sum(pending.num_rows for pending in self._pending) >= SPOOL_BATCH:
                self._flush()

    def drain(self) -> pa.Table:
        """Every row added, in the order added; the stream is closed (and stays on disk until :meth:`remove`)."""
        with self._lock:
            self._flush()
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            return self._read()

    def snapshot(self) -> pa.Table:
        """Every row added so far, in the order added; the stream stays open for more."""
        with self._lock:
            self._flush()
            return self._read()

    def _read(self) -> pa.Table:
        return pa.ipc.open_stream(str(self.path)).read_all() if self.path.exists() else RESULTS_SCHEMA.empty_table()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _flush(self) -> None:
        """Append the pending rows as one record batch (call with the lock held)."""
        if not self._pending:
            return
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pa.ipc.new_stream(str(self.path), RESULTS_SCHEMA)
        self._writer.write_table(pa.concat_tables(self._pending).combine_chunks())
        self._pending = []
