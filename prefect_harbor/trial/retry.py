"""Another try for an attempt that measured nothing for a cause that may pass.

The scoring contract (``prefect_harbor/scoring.py``) leaves a *not scored* attempt out of every
mean. When its cause may pass (the sandbox failed to start, the model endpoint was away:
:func:`~prefect_harbor.scoring.worth_retrying`), the attempt is tried again, up to the backend's
``not_scored_retries``, after a wait that doubles from ``retry_wait_sec``; its result row is the
last try's, with ``tries`` saying how many it took. A scored attempt (even a 0) and an agent
failure are the agent's own outcome: never tried again. This is not Prefect's task retry (a
sweep's tasks are retry-free): the attempt keeps its key, its task run and its trial name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from prefect_harbor.scoring import scoring_of, worth_retrying
from prefect_harbor.spec import Limits
from prefect_harbor.storage.results import RowResult

#: No wait between tries is longer than this.
MAX_WAIT_SEC = 600.0


def retry_wait(result: RowResult, tries: int, limits: Limits) -> float | None:
    """The seconds to wait before try ``tries + 1`` of the attempt ``result`` ended, or None: no further try."""
    if tries > limits.not_scored_retries or not worth_retrying(vars(result)):
        return None
    return min(limits.retry_wait_sec * 2 ** (tries - 1), MAX_WAIT_SEC)


def set_aside(result: RowResult, tries: int, task_copy: Path) -> Path | None:
    """Clear the next try's way: the failed try's task copy is removed (the next try copies the task
    again) and its trial directory moved to ``<trial>.try<n>``, kept to look at; that path, or None
    when the try left no trial."""
    shutil.rmtree(task_copy, ignore_errors=True)
    if result.trial_dir is None or not Path(result.trial_dir).is_dir():
        return None
    kept = Path(f"{result.trial_dir}.try{tries}")
    shutil.rmtree(kept, ignore_errors=True)  # from a run resumed after a crash mid-retry
    Path(result.trial_dir).rename(kept)
    return kept


def retry_line(result: RowResult, tries: int, wait: float, limits: Limits, kept: Path | None) -> str:
    """The log line of a try that is tried again."""
    _, cause = scoring_of(vars(result))
    attempt = f" #{result.attempt}" if result.attempt > 1 else ""
    where = f"; its trial is kept at {kept}" if kept is not None else ""
    return (
        f"Row {result.row_id}{attempt}: not scored ({cause}: {result.err_message}); trying it again in {wait:g} s "
        f"(try {tries + 1} of at most {limits.not_scored_retries + 1}){where}"
    )
