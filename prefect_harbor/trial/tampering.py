"""A row's verdict on its verifier: the sandbox's evidence of tampering, and the backend's policy.

The local sandbox records, from outside the container, what could let an agent forge its
reward in Harbor's shared mode (``sandbox/verifier_watch.py``: reward files planted or
rewritten, programs replaced) in the trial's sandbox report. Here that becomes the row's
``verifier_tampering`` column:

* a list of short lines, empty when the verifier's run was checked and nothing was found;
* null when it was not checked: a trial in another Harbor environment, one that never got to
  its verifier, or a separate verifier whose own image brought its tests (nothing of the
  agent's runs there; a separate verifier on a fresh copy of the task's image is checked);

and the backend's ``on_tampering`` decides what it does to the row: ``flag`` (the default)
keeps the outcome and adds the evidence to what the row says; ``fail`` makes the row a failure
of category ``verifier_tampering``, its reward void.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect_harbor.sandbox.trial_report import read_sections
from prefect_harbor.storage.results import RowResult

OnTampering = Literal["flag", "fail"]
#: The most lines a row's evidence keeps (the sandbox report has the rest).
_KEPT = 20


def evidence(trial_dir: Path) -> list[str] | None:
    """The findings of every verifier run of the trial, in order, without repeats; None when none was checked."""
    verifications = read_sections(trial_dir, "verifications")
    if verifications is None:
        return None
    found: list[str] = []
    for verification in verifications:
        for line in verification.get("findings") or []:
            if isinstance(line, str) and line not in found:
                found.append(line[:300])
    return found[:_KEPT] + ([f"and {len(found) - _KEPT} more (the archive's sandbox/ report lists them)"] if len(found) > _KEPT else [])


def judge(row: RowResult, trial_dir: Path, on_tampering: OnTampering) -> RowResult:
    """``row`` with its ``verifier_tampering`` evidence, and ``on_tampering`` applied to it."""
    found = evidence(trial_dir)
    row = row.model_copy(update={"verifier_tampering": found})
    if not found or row.status == "cancelled":
        return row
    said = "verifier tampering: " + "; ".join(found)
    if on_tampering == "fail":
        message = said + (f" (the verifier said: {row.err_message})" if row.err_message else f" (the verifier's reward was {row.reward:g})" if row.reward is not None else "")
        return row.model_copy(update={"status": "failure", "reward": None, "err_category": "verifier_tampering", "err_phase": "verifier", "err_message": message})
    if row.status == "failure":
        return row.model_copy(update={"err_message": f"{row.err_message}; {said}" if row.err_message else said})
    return row
