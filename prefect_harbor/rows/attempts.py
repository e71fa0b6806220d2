"""The unit of a sweep's work: one attempt at one dataset row.

A backend with ``attempts: k`` runs every row k independent times (Harbor's ``n_attempts``).
Each attempt is a unit of its own from admission to the results: its own Harbor trial and
trial name, its own result row keyed ``(row_id, attempt)``, its own archive, status and
resume. Nothing an attempt needs comes from another attempt, so an attempt can run wherever
a row can (inline, on a Dask worker, on another host).

Attempts of a row are admitted one after the other (row 1's k attempts, then row 2's):
the dataset is read once, and a sweep stopped early holds whole rows. Harbor's ``Job`` orders
its trials attempt by attempt instead; the attempts, and so the results, are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prefect_harbor.rows.dataset import DatasetRow, RowProblem

#: Said (by the CLI and the flow) when agent failures are to be re-run without the run they are in.
RERUN_ALONE = "rerun_agent_failures: only means something with rerun_failed (--rerun-failed): give the earlier run's folder, or drop it."

Row = DatasetRow | RowProblem


@dataclass(frozen=True)
class RowAttempt:
    """Attempt ``attempt`` (from 1) at the dataset row at position ``index``."""

    index: int
    row: Row
    attempt: int = 1

    @property
    def key(self) -> tuple[int, int]:
        """What identifies the attempt in the run: ``(row_index, attempt)``."""
        return self.index, self.attempt

    def label(self, attempts: int) -> str:
        """``<row id>``, with ``#<attempt>`` when rows have several attempts."""
        return self.row.id if attempts == 1 else f"{self.row.id} #{self.attempt}"


def expand(rows: Iterable[tuple[int, Row]], attempts: int, only: Mapping[str, Sequence[int]] | None = None) -> Iterator[RowAttempt]:
    """Every attempt of every row, row by row: 1 … ``attempts``, or, for a row ``only`` names, just those attempts."""
    for index, row in rows:
        numbers = only[row.id] if only is not None and row.id in only else range(1, attempts + 1)
        for attempt in numbers:
            yield RowAttempt(index, row, attempt)
