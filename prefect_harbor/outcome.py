"""How a row's outcome reads for people: task-run state names and messages, table cells, counts.

One place for the wording the Prefect UI shows, so the badge of a row's task run, its log
line, the row table artifact and the flow run's final state say the same thing. Prefect
draws a state's *name* in its badge (as with its own "Cached" or "Late") and keeps the
state's *type* for colour and semantics: a row's task run is Completed named ``Reward 1``,
Failed named after its category (``Verifier error``), or Cancelled.

Figures are rounded here for reading (:func:`figure`); the results table and every file keep
full precision.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the results module builds its row table with this one
    from prefect_harbor.storage.results import RowResult

#: A failure's state name, by category (Harbor's failure kinds, as the results name them).
CATEGORY_NAMES = {
    "timeout": "Timeout",
    "validation_error": "Validation error",
    "agent_error": "Agent error",
    "verifier_error": "Verifier error",
    "verifier_tampering": "Verifier tampering",
}


def figure(value: float | None) -> str:
    """A number for people: three significant digits (``0.857``, ``1``, ``12.3``); ``-`` for none."""
    return "-" if value is None else f"{value:.3g}"


def rounded(value: float | None) -> float | None:
    """``value`` to three significant digits, as a number (for table artifacts): ``0.8571428571428571`` -> ``0.857``."""
    return None if value is None else float(figure(value))


def state_name(result: RowResult) -> str:
    """The badge of a one-row task run: ``Reward 0.5``, the failure's category, or ``Cancelled``."""
    if result.status == "success":
        return "No reward" if result.reward is None else f"Reward {figure(result.reward)}"
    if result.status == "failure":
        return CATEGORY_NAMES.get(result.err_category or "", "Failed")
    return "Cancelled"


def describe(result: RowResult) -> str:
    """A row's outcome in one line: ``reward 0.75``, or its category and message; then its archive."""
    reward = "no reward" if result.reward is None else f"reward {result.reward:g}"
    line = (reward if result.status == "success" else f"{result.err_category or result.status}: {result.err_message}") + tampering(result)
    if result.status != "success" or result.archive_error:
        line += f"; archive {result.artifact_uri or '-'}" + (f" ({result.archive_error})" if result.archive_error else "")
    return line


def row_line(result: RowResult) -> str:
    """A row's log line: ``Row zero-1 (zero): success, reward 0; environment 1.2 s, …, total 3.4 s; archive file:///…``
    (``Row zero-1 #2 (zero): …`` for a second attempt)."""
    if result.status == "success":
        what = "success, no reward" if result.reward is None else f"success, reward {result.reward:g}"
    else:  # ``failure, validation_error: …``; ``cancelled: cancelled while running``
        what = f"{result.status}, {result.err_category}: {result.err_message}" if result.err_category else f"{result.status}: {result.err_message}"
    what += tampering(result) + checks(result)
    archive = f"archive {result.artifact_uri or '-'}" + (f" ({result.archive_error})" if result.archive_error else "")
    attempt = f" #{result.attempt}" if result.attempt > 1 else ""  # the task run's label: attempts after the first
    tries = f" after {result.tries} tries" if result.tries > 1 else ""
    return f"Row {result.row_id}{attempt} ({result.task or 'no task'}): {what}{tries}; {timings(result)}; {archive}"


def tampering(result: RowResult) -> str:
    """``; verifier tampering: …`` when the row has evidence its message does not say already (``on_tampering = "flag"``)."""
    if not result.verifier_tampering or "verifier tampering: " in (result.err_message or ""):
        return ""
    return "; verifier tampering: " + "; ".join(result.verifier_tampering)


def checks(result: RowResult) -> str:
    """``; checked: verifier shared, no tampering seen, task certified (sha256:…)``: what its reward was checked for, when anything was."""
    seen = [f"verifier {result.verifier_mode}"] if result.verifier_mode else []
    if result.verifier_tampering == []:
        seen.append("no tampering seen")
    if result.certification:
        seen.append(f"task {result.certification.split('): ', 1)[0]})")
    return f"; checked: {', '.join(seen)}" if seen else ""


_PHASES = (
    ("environment_setup_sec", "environment"),
    ("agent_setup_sec", "agent setup"),
    ("agent_sec", "agent"),
    ("verifier_sec", "verifier"),
    ("total_sec", "total"),
)


def timings(result: RowResult) -> str:
    """The row's phases in seconds, as measured (``environment 1.2 s, …, total 3.4 s``); ``no timings`` when none ran."""
    spans = [f"{label} {getattr(result, field):.1f} s" for field, label in _PHASES if getattr(result, field) is not None]
    return ", ".join(spans) or "no timings"


@dataclass(frozen=True)
class Counts:
    """How a group of rows ended: a batch's task run, or the whole sweep."""

    rows: int
    #: Rows scored above zero.
    rewarded: int
    failed: int
    cancelled: int
    mean_reward: float | None

    @classmethod
    def of(cls, results: Iterable[RowResult]) -> Counts:
        results = list(results)
        scored = [r.reward for r in results if r.reward is not None]
        return cls(
            rows=len(results),
            rewarded=sum(1 for reward in scored if reward > 0),
            failed=sum(1 for r in results if r.status == "failure"),
            cancelled=sum(1 for r in results if r.status == "cancelled"),
            mean_reward=sum(scored) / len(scored) if scored else None,
        )

    def name(self) -> str:
        """A state name for the group: ``3/4 rewarded, 1 failed, mean 0.75`` (what the UI's run lists show)."""
        parts = [f"{self.rewarded}/{self.rows} rewarded"]
        parts += [f"{count} {what}" for count, what in ((self.failed, "failed"), (self.cancelled, "cancelled")) if count]
        if self.mean_reward is not None:
            parts.append(f"mean {figure(self.mean_reward)}")
        return ", ".join(parts)


def table_row(result: RowResult) -> dict:
    """A row of the ``evaluation-sweep-rows`` artifact: its outcome, reward rounded, and where its archive is."""
    return {
        "row": result.row_id,
        "task": result.task,
        "status": result.status,
        "reward": rounded(result.reward),
        "category": result.err_category,
        "archive": result.artifact_uri,
        "message": (result.err_message or tampering(result).removeprefix("; "))[:200] or None,
    }
