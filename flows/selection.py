"""Which rows and attempts a sweep runs: the dataset's first pass, an earlier run's failures, a resumed run's kept attempts.

A sweep reads its dataset twice: once before anything runs (count, fingerprint, ids, the
tasks to prewarm), then row by row as lanes free up, each row as its ``attempts`` units of
work (``rows/attempts.py``). ``rerun_failed`` narrows both passes to an earlier run's attempts
that measured nothing (not scored or cancelled, by the scoring contract: ``prefect_harbor/scoring.py``),
and its agent failures when asked, their rows under new ids; a scored attempt is never run again.
``resume`` keeps a run's finished attempts, once its dataset and configuration are known to be the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_jsonable_python

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.config import ConfigurationError
from prefect_harbor.rows.attempts import RERUN_ALONE, RowAttempt, expand
from prefect_harbor.rows.dataset import DatasetInfo, DatasetRow, RowProblem, iter_rows
from prefect_harbor.scoring import Scoring, scoring_of
from prefect_harbor.storage.manifest import RunManifest
from prefect_harbor.storage.reading import DamagedFile
from prefect_harbor.storage.results import RowResult
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.tasks import inspect_dataset

#: Backend fields that change capacity or local paths, not what a row computes.
RESUMABLE_DIFFERENCES = frozenset({"n_concurrent", "max_queue_depth", "trials_dir", "not_scored_retries", "retry_wait_sec"})


@dataclass(frozen=True)
class Selection:
    """The dataset's rows this run is about: what the first pass learned, each row's attempts, and the rerun's new ids."""

    dataset: str
    info: DatasetInfo
    #: Attempts per row.
    attempts: int = 1
    #: Original id -> new id, when the run re-runs an earlier run's failures.
    reruns: dict[str, str] | None = None
    #: New id -> the attempts it re-runs (not scored or cancelled; agent failures when asked), when the run re-runs failures.
    rerun_attempts: dict[str, list[int]] | None = None

    @classmethod
    async def inspect(
        cls, dataset: str, rerun_failed: str | None, storage_options: dict[str, Any] | None, logger: logging.Logger | logging.LoggerAdapter,
        attempts: int = 1, rerun_agent_failures: bool = False,
    ) -> Selection:  # fmt: skip
        """The first pass over the dataset (the ``inspect-dataset`` task), narrowed to ``rerun_failed``'s rows and attempts."""
        if rerun_agent_failures and not rerun_failed:
            raise ConfigurationError(RERUN_ALONE)
        info = await asyncio.to_thread(inspect_dataset, dataset)
        if not rerun_failed:
            return cls(dataset, info, attempts)
        previous = RunStore.open(rerun_failed, storage_options)
        chosen = await asyncio.to_thread(rerun_choice, previous, rerun_agent_failures)
        failed = chosen.in_dataset_order(info.ids)
        reruns = {row_id: f"{row_id}~rerun" for row_id in failed}
        info = info.model_copy(update={"ids": list(reruns.values()), "rows": len(reruns)})
        logger.info(f"Re-running {chosen.describe()} ({len(reruns)} rows) of {previous.uri()}")
        return cls(dataset, info, attempts, reruns, {reruns[row_id]: numbers for row_id, numbers in failed.items()})

    @property
    def units(self) -> int:
        """How many attempts this run is about: rows times attempts, or the attempts re-run."""
        return self.info.rows * self.attempts if self.rerun_attempts is None else sum(map(len, self.rerun_attempts.values()))

    @property
    def tracked(self) -> int | dict[str, list[int]]:
        """Each row's attempts, as the live status tracks them."""
        return self.attempts if self.rerun_attempts is None else self.rerun_attempts

    def rows(self) -> Iterator[tuple[int, DatasetRow | RowProblem]]:
        """The second pass, streamed: ``(index, row)`` for every row of this run, in dataset order."""
        rows = iter_rows(self.dataset)
        return enumerate(rows if self.reruns is None else rerun_rows(rows, self.reruns))

    def attempts_to_run(self, attempt: int | None = None) -> Iterator[RowAttempt]:
        """Every attempt of this run, streamed: a row's attempts one after the other, rows in dataset order;
        with ``attempt``, only that attempt of every row (a round of a sweep with a stopping rule)."""
        units = expand(self.rows(), self.attempts, self.rerun_attempts)
        return units if attempt is None else (unit for unit in units if unit.attempt == attempt)


def prepare_resume(
    store: RunStore, manifest: RunManifest, fingerprint: str
) -> tuple[RunManifest, dict[tuple[int, int], RowResult], list[str]]:
    """Check that the run can be continued; keep its finished attempts, drop the rest: the resumed
    manifest, the kept attempts by ``(row_index, attempt)``, and the ids of the recorded rows that
    will run again (cancelled attempts: their earlier task runs are superseded).

    A damaged manifest (cut short by a crash) cannot be compared with: the run carries on with
    this run's manifest, saying so, rather than losing the rows its parts hold."""
    try:
        previous = store.read_manifest()
    except FileNotFoundError:
        raise ConfigurationError(f"resume: {store.uri()} has no manifest.json; give the folder of an earlier run.") from None
    except DamagedFile as error:
        store.logger.warning(
            f"resume: {error}. The dataset and the backend configuration could NOT be compared with that run's; "
            "carrying on with this run's. If either changed, its kept rows do not belong to this run: start a new sweep instead."
        )
        previous = manifest
    if previous.state == "Completed":
        raise ConfigurationError(f"resume: {store.uri()} already completed; start a new sweep instead.")
    if previous.dataset.get("fingerprint") != fingerprint:
        raise ConfigurationError(f"resume: the dataset changed since run {previous.run_id} (its rows differ); resume with the same dataset or start a new sweep.")
    changed = sorted(
        key for key in {*previous.configuration, *manifest.configuration} - RESUMABLE_DIFFERENCES
        if _configured(previous.configuration, key) != _configured(manifest.configuration, key)
    )  # fmt: skip
    if changed:
        raise ConfigurationError(f"resume: the backend configuration changed since run {previous.run_id} ({', '.join(changed)}); use the same configuration or start a new sweep.")
    recorded = store.read_results()
    kept = {(r.row_index, r.attempt): r for r in recorded if r.status in ("success", "failure")}
    dropped = sorted((r for r in recorded if (r.row_index, r.attempt) not in kept), key=lambda r: (r.row_index, r.attempt))
    superseded = list(dict.fromkeys(r.row_id for r in dropped))
    store.restart_from(list(kept.values()), dropped=dropped)
    resumed = previous.model_copy(
        update={"state": "Running", "flow_run_id": manifest.flow_run_id, "flow_run_name": manifest.flow_run_name, "finished_at": None, "resumed": previous.resumed + 1}
    )
    return resumed, kept, superseded


def _configured(configuration: dict[str, Any], key: str) -> Any:
    """A configuration's value for ``key``; a run from before the field existed ran with its default."""
    if key in configuration:
        return configuration[key]
    field = HarborBackend.model_fields.get(key)
    return None if field is None or field.is_required() else to_jsonable_python(field.get_default(call_default_factory=True))


#: What a rerun takes by default: the attempts that measured nothing of the agent.
RERUN_BY_DEFAULT: frozenset[Scoring] = frozenset({"not_scored", "cancelled"})


@dataclass(frozen=True)
class RerunChoice:
    """An earlier run's attempts a rerun takes, and why each kind was taken or left."""

    #: Original id -> the attempts to run again.
    attempts: dict[str, list[int]]
    #: How many attempts of each scoring (``prefect_harbor/scoring.py``) the earlier run had, and were taken.
    seen: Counter[Scoring]
    taken: frozenset[Scoring]

    def in_dataset_order(self, dataset_ids: list[str]) -> dict[str, list[int]]:
        return {row_id: sorted(self.attempts[row_id]) for row_id in dataset_ids if row_id in self.attempts}

    def describe(self) -> str:
        """``3 attempts (2 not scored, 1 cancelled; 4 agent failures and 5 scored kept)``."""
        words = {"not_scored": "not scored", "cancelled": "cancelled", "agent_failure": "agent failures", "scored": "scored"}
        taken = [f"{self.seen[s]} {words[s]}" for s in words if s in self.taken and self.seen[s]]
        kept = [f"{self.seen[s]} {words[s]}" for s in words if s not in self.taken and self.seen[s]]
        return f"{sum(self.seen[s] for s in self.taken)} attempts ({', '.join(taken)}" + (f"; {' and '.join(kept)} kept)" if kept else ")")


def rerun_choice(previous: RunStore, agent_failures: bool = False) -> RerunChoice:
    """The earlier run's attempts that measured nothing (not scored, cancelled), and its agent failures
    when ``agent_failures``; a scored attempt is never taken (more samples of a row are ``attempts``)."""
    taken = RERUN_BY_DEFAULT | ({"agent_failure"} if agent_failures else set())
    seen: Counter[Scoring] = Counter()
    chosen: dict[str, list[int]] = {}
    for result in previous.read_results():
        scoring, _ = scoring_of(vars(result))
        seen[scoring] += 1
        if scoring in taken:
            chosen.setdefault(result.row_id, []).append(result.attempt)
    if not chosen:
        hint = (
            f"; its {seen['agent_failure']} agent failures run again with rerun_agent_failures (--rerun-agent-failures)"
            if seen["agent_failure"] and not agent_failures else ""
        )  # fmt: skip
        raise ConfigurationError(f"rerun_failed: {previous.uri()} has no attempt to run again (none not scored or cancelled{hint}; scored attempts are never re-run).")
    return RerunChoice(chosen, seen, frozenset(taken))


def rerun_rows(rows: Iterable[DatasetRow | RowProblem], reruns: dict[str, str]) -> Iterator[DatasetRow | RowProblem]:
    """Only the rows to re-run, under their new ids; the original id stays in their metadata."""
    for row in rows:
        if row.id in reruns:
            update: dict[str, Any] = {"id": reruns[row.id]}
            if isinstance(row, DatasetRow):
                update["metadata"] = {**row.metadata, "original_row_id": row.id}
            yield row.model_copy(update=update)
