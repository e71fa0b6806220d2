"""The scoring contract: which attempts a mean counts, and as what.

Every attempt is one of:

- **scored**: the verifier gave it a reward (whatever else happened); the mean counts the reward.
- **agent failure**: the agent errored, timed out, left nothing to grade, or tampered with its
  verifier (``on_tampering = "fail"``) before a reward could be given; the mean counts it as 0,
  as Harbor's viewer does. An agent that crashes must not look better than one that scores 0.
- **not scored**: the row, the task's setup or build, the sandbox, the model endpoint, the
  verifier or the sweep itself failed, or the task is not certified (``certified_tasks_only``); nothing was measured of the agent, so the mean leaves it
  out, and every figure says how many and why (its *cause*). Not when the agent could have
  caused it: once the agent has run, its sandbox is its own, so that sandbox failing, or a
  verifier or grader that shares it (Harbor's shared verifier mode) failing, is an agent
  failure; otherwise an agent that cannot solve a task could break its verifier and turn its 0
  into an attempt the mean leaves out.
- **cancelled**: it did not finish; counted apart, never in a mean.

Harbor's own error policy (``harbor.models.trial.error_policy``: a row's ``failure_cause``)
decides first; then the phase the attempt failed in and Osmosis's category.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

#: Nothing to grade: the workflow returned no messages (the start of such a row's ``err_message``).
NO_SAMPLE = "No sample to grade"

Scoring = Literal["scored", "agent_failure", "not_scored", "cancelled"]

#: Harbor's failure causes that measured nothing of the agent, and the word a figure shows for each.
NOT_SCORED_CAUSES = {"sandbox_failed": "sandbox", "model_provider_failed": "model_endpoint", "harbor_failed": "sweep", "verifier_failed": "verifier"}
#: The phases before the agent ran: a failure there is the row's, the task's or the sandbox's.
SETUP_PHASES = {"setup": "setup", "environment_setup": "sandbox", "agent_setup": "agent_setup", "certification": "uncertified"}
#: Osmosis's categories of a failure that is the agent's own.
AGENT_CATEGORIES = frozenset({"agent_error", "timeout", "verifier_tampering"})
#: Causes the agent may have brought about once it has run: its sandbox's, and a verifier's or grader's that shares it.
AGENT_REACHABLE_CAUSES = frozenset({"sandbox", "verifier", "grading"})
#: The phases of the verifier (and an Osmosis grader, which runs as one).
VERIFIER_PHASES = frozenset({"verifier", "grading"})
#: The causes of a not-scored attempt that another try may pass: the sandbox's and the model endpoint's.
RETRYABLE_CAUSES = frozenset({"sandbox", "agent_setup", "model_endpoint"})


def scoring_of(record: Mapping[str, Any]) -> tuple[Scoring, str | None]:
    """How the contract counts one attempt (a results-table row as a mapping), and, when not scored, why."""
    scoring, cause = _scoring(record)
    if scoring == "not_scored" and _within_the_agents_reach(record, cause):
        return "agent_failure", None
    return scoring, cause


def _within_the_agents_reach(record: Mapping[str, Any], cause: str | None) -> bool:
    """Whether the agent could have caused the failure: its sandbox failed after it started, or a
    verifier sharing that sandbox (any mode but Harbor's ``separate``) failed."""
    phase = record.get("err_phase")
    if cause == "sandbox" and phase == "agent":
        return True
    return cause in AGENT_REACHABLE_CAUSES and phase in VERIFIER_PHASES and record.get("verifier_mode") != "separate"


def _scoring(record: Mapping[str, Any]) -> tuple[Scoring, str | None]:
    """The contract's reading of the attempt's outcome alone (see :func:`scoring_of`)."""
    status, category, phase = record.get("status"), record.get("err_category"), record.get("err_phase")
    if status == "cancelled":
        return "cancelled", None
    if record.get("reward") is not None:
        return "scored", None
    cause = NOT_SCORED_CAUSES.get(record.get("failure_cause") or "")
    if cause is not None:
        return "not_scored", cause
    if phase in SETUP_PHASES:
        return "not_scored", SETUP_PHASES[phase]
    if category == "verifier_error":
        return "not_scored", "verifier"
    if category == "validation_error":
        if str(record.get("err_message") or "").startswith(NO_SAMPLE):
            return "agent_failure", None
        return "not_scored", "grading" if phase == "grading" else "setup"
    if category in AGENT_CATEGORIES:
        return "agent_failure", None
    return "not_scored", category or "unknown"


def worth_retrying(record: Mapping[str, Any]) -> bool:
    """Whether another try of the attempt may measure what this one could not: not scored for a
    passing cause, and Harbor's error policy retries its exception (a bad request to the model
    endpoint, a refused key or a build that failed will fail again)."""
    from harbor.models.trial.error_policy import policy_for

    scoring, cause = scoring_of(record)
    if scoring != "not_scored" or cause not in RETRYABLE_CAUSES:
        return False
    exception = record.get("exception_type")
    return not exception or policy_for(exception).retry


def counted_value(record: Mapping[str, Any]) -> float | None:
    """The value a mean counts for the attempt: its reward, 0 for an agent failure, None when it counts for nothing."""
    scoring, _ = scoring_of(record)
    if scoring == "scored":
        return float(record["reward"])
    return 0.0 if scoring == "agent_failure" else None
