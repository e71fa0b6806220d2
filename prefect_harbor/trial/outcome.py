"""A finished Harbor trial read as a row's outcome, with the Osmosis backend's precedence.

Osmosis's words decide ``status`` and ``err_category``; Harbor's error policy names the
``failure_cause`` beside them, so a row reads the same to an Osmosis user and to a Harbor one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from harbor.models.trial.error_policy import policy_for
from harbor.models.trial.result import ExceptionInfo, TimingInfo, TrialResult

from prefect_harbor.agents.harness import sample_messages
from prefect_harbor.bounds import REWARD_FILE_BYTES
from prefect_harbor.scoring import NO_SAMPLE
from prefect_harbor.secrets import Redactor
from prefect_harbor.storage.results import ErrorCategory, RowResult
from prefect_harbor.trial import reward_key

#: The exceptions Osmosis files under ``timeout``. Harbor's error policy sees some of them
#: otherwise (an environment that did not start in time is ``sandbox_failed`` there): a row
#: keeps both words, Osmosis's in ``err_category`` and Harbor's in ``failure_cause``.
OSMOSIS_TIMEOUTS = frozenset({"AgentTimeoutError", "AgentSetupTimeoutError", "VerifierTimeoutError", "EnvironmentStartTimeoutError", "TimeoutError"})


#: What Osmosis's grader runner raises when ``grade()`` set no reward (then no reward file exists).
NO_REWARD_AFTER_GRADING = "Sample has no reward after grading"


def workflow_outcome(row: RowResult, container_result: dict | None, verifier_output: str = "") -> RowResult:
    """Apply the workflow's own report: its failure is the row's cause; no sample means nothing to grade.

    Osmosis's order: a Harbor agent-phase error already decided the row; then a workflow
    that reported failure; then a success without a sample is a validation error.
    """
    messages = sample_messages(container_result)
    row = row.model_copy(update={"final_messages": json.dumps(messages, default=str) if messages else None})
    if row.status == "cancelled" or (row.status == "failure" and row.err_phase in ("setup", "environment_setup", "agent_setup", "agent")):
        return row
    if container_result is None:
        return row.model_copy(update={"status": "failure", "reward": None, "err_category": "agent_error", "err_phase": "agent", "err_message": "the workflow left no "
            "container_result.json"})
    if container_result.get("status") != "success":
        message = container_result.get("err_message") or "the workflow reported failure"
        return row.model_copy(update={"status": "failure", "reward": None, "err_category": "agent_error", "err_phase": "agent", "err_message": message})
    if row.status == "failure" and row.err_phase == "verifier" and NO_REWARD_AFTER_GRADING in verifier_output:
        return row.model_copy(update={"err_category": "validation_error", "err_phase": "grading", "err_message": f"{NO_REWARD_AFTER_GRADING} (the grader never "
            f"called ctx.set_reward)"})
    if messages is None and row.status == "success":
        message = f"{NO_SAMPLE}: the workflow returned no messages and registered no sample"
        return row.model_copy(update={"status": "failure", "reward": None, "err_category": "validation_error", "err_phase": "grading", "err_message": message})
    return row


def outcome(base: RowResult, result: TrialResult, reward_spec: str = reward_key.DEFAULT, reward_range: str | list[float] = "finite") -> RowResult:
    """Map a TrialResult to a row result with the Osmosis backend's precedence.

    An exception raised before the verifier started stays the reported cause; then the
    verifier's reward key (``reward_spec``: ``reward`` by default) decides, within
    ``reward_range`` (``[low, high]``, or ``"finite"``); a trial with neither has no reward source.
    """
    error = result.exception_info
    rewards = dict((result.verifier_result.rewards or {}) if result.verifier_result else {})
    fields = {
        "rewards": {key: float(value) for key, value in rewards.items() if _is_number(value)},
        "exception_type": error.exception_type if error else None,
        "failure_cause": failure_cause(error.exception_type if error else None),
        "err_phase": failure_phase(result),
        "verifier_mode": None if result.verifier_environment_mode is None else str(result.verifier_environment_mode.value),
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        **_timings(result),
        **_metrics(result),
    }
    if error is not None and error.exception_type == "CancelledError":
        return base.model_copy(update={**fields, "status": "cancelled", "err_message": "cancelled"})
    agent_error = agent_phase_failure(result)
    if agent_error is not None:
        return base.model_copy(update={**fields, "err_category": error_category(agent_error.exception_type), "err_message": agent_error.exception_message})
    if result.verifier_result is not None:
        # Harbor's model turns a JSON true into 1: the file as written is what counts.
        rewards = {**rewards, **_reward_file_as_written(result)}
        not_numbers = sorted(key for key, value in rewards.items() if not _is_number(value))
        if not_numbers:
            message = (
                f"verifier/reward.json: {', '.join(f'{k!r} is {rewards[k]!r}' for k in not_numbers)}; "
                "Harbor rewards are numbers (a boolean is not one): write e.g. {\"reward\": 1.0}"
            )
            return base.model_copy(update={**fields, "err_category": "verifier_error", "err_message": message, "err_phase": "verifier"})
        reward = reward_key.reward_of(rewards, reward_spec)
        if reward is None:
            counts = "only 'reward' counts" if reward_spec == reward_key.DEFAULT else f"the reward is {reward_spec}"
            message = f"Sample has no reward after grading (the verifier wrote {sorted(rewards)}; {counts})"
            return base.model_copy(update={**fields, "err_category": "validation_error", "err_message": message, "err_phase": "grading"})
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            return base.model_copy(update={**fields, "err_category": "validation_error", "err_message": f"reward must be a finite number, got {reward!r}", "err_phase": "grading"})
        if out_of_range := _outside(rewards, reward_spec, reward, reward_range):
            return base.model_copy(update={**fields, "err_category": "verifier_error", "err_message": out_of_range, "err_phase": "verifier"})
        return base.model_copy(update={**fields, "status": "success", "reward": float(reward), "err_phase": None})
    if error is not None:
        category = error_category(error.exception_type)
        if category != "timeout" and fields["err_phase"] == "verifier":
            return base.model_copy(update={**fields, "err_category": "verifier_error", "err_message": _verifier_message(error, base.task)})
        return base.model_copy(update={**fields, "err_category": category, "err_message": error.exception_message})
    message = "trial ended with no verifier result and no recorded error; the task has no reward source (no tests/ and no grader)"
    return base.model_copy(update={**fields, "err_category": "validation_error", "err_message": message, "err_phase": "grading"})


def _outside(rewards: dict, reward_spec: str, reward: float, reward_range: str | list[float]) -> str | None:
    """Why the reward (or a key it is made of) is outside the backend's ``reward_range``, or None."""
    if not isinstance(reward_range, list):
        return None
    low, high = reward_range
    keys = reward_key.parse(reward_spec)[1]
    outside = [f"{key} = {rewards[key]:g}" for key in keys if not low <= rewards[key] <= high]
    if not outside and not low <= reward <= high:
        outside = [f"the reward {reward_spec} = {reward:g}"]
    if not outside:
        return None
    return f"verifier/reward: {', '.join(outside)} is outside the backend's reward_range [{low:g}, {high:g}]; fix the task's verifier, or widen reward_range"


def agent_phase_failure(result: TrialResult) -> ExceptionInfo | None:
    """The recorded exception, when it struck before verification started."""
    error = result.exception_info
    if error is None:
        return None
    verifier_started = result.verifier.started_at if result.verifier else None
    if verifier_started is None or error.occurred_at < verifier_started:
        return error
    return None


def failure_phase(result: TrialResult) -> str:
    spans = [
        ("verifier", result.verifier),
        ("agent", result.agent_execution),
        ("agent_setup", result.agent_setup),
        ("environment_setup", result.environment_setup),
    ]
    if agent_phase_failure(result) is not None:
        spans = spans[1:]
    return next((name for name, span in spans if span is not None), "setup")


def _reward_file_as_written(result: TrialResult) -> dict[str, object]:
    """``verifier/reward.json`` of the trial as its verifier wrote it (empty if absent or unreadable)."""
    uri = result.trial_uri
    if not uri or not uri.startswith("file://"):
        return {}
    path = Path(unquote(urlsplit(uri).path)) / "verifier" / "reward.json"
    try:
        readable = path.is_file() and not path.is_symlink() and path.stat().st_size <= REWARD_FILE_BYTES
        document = json.loads(path.read_text()) if readable else {}
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def verifier_output_tail(trial_dir: Path, lines: int = 20, limit: int = 1500) -> str:
    """The end of what the verifier printed (test-stdout.txt), to say why it wrote no usable reward."""
    tail = verifier_output(trial_dir, lines=lines, max_bytes=limit)
    return f"; the verifier's output ends:\n{tail}" if tail else "; the verifier printed nothing"


def verifier_output(trial_dir: Path, redactor: Redactor = Redactor(), lines: int = 20, max_bytes: int = 4096) -> str:
    """The last ``lines`` lines the verifier printed (``verifier/test-stdout.txt``), at most ``max_bytes`` of them, redacted.

    Read from the end: the output is as long as the task (and an agent's leftovers) make it.
    The read starts a secret's length earlier than the window, so a secret the window's start
    cuts is read whole, redacted, and only then cut."""
    margin = max((len(secret.encode()) for secret in redactor.secrets), default=0)
    try:
        with (trial_dir / "verifier" / "test-stdout.txt").open("rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - max_bytes - margin))
            data = file.read()
    except OSError:
        return ""
    text = redactor.text(data.decode(errors="replace")).rstrip()
    text = text.encode()[-max_bytes:].decode(errors="ignore")
    return "\n".join(text.splitlines()[-lines:])


def _verifier_message(error: ExceptionInfo, task: str | None = None) -> str:
    """The verifier's failure, naming the task, the reward file and what Harbor expects of it."""
    text = error.exception_message or error.exception_type
    if error.exception_type == "RewardFileNotFoundError":
        return (
            f"task {task or '(unknown)'!r}: its tests/test.sh ended without writing a reward (Harbor reads /logs/verifier/reward.txt "
            "or /logs/verifier/reward.json, and found neither): a verifier error, not the agent's; fix the verifier so it writes one "
            "whatever the tests find (RewardFileNotFoundError)"
        )
    if error.exception_type == "ValidationError" and "dictionary" in text:
        return f"verifier/reward.json must hold a JSON object of numbers, e.g. {{\"reward\": 1.0}}; Harbor said: {text}"
    return f"{error.exception_type}: {text}"


def error_category(exception_type: str) -> ErrorCategory:
    """Osmosis's category of a trial that raised ``exception_type``: a timeout, or the agent's error."""
    return "timeout" if exception_type in OSMOSIS_TIMEOUTS else "agent_error"


def failure_cause(exception_type: str | None) -> str | None:
    """Harbor's cause for an exception (``harbor.models.trial.error_policy``): who or what ended the trial."""
    return None if exception_type is None else policy_for(exception_type).cause.value


def _seconds(span: TimingInfo | TrialResult | None) -> float | None:
    if span is None or span.started_at is None or span.finished_at is None:
        return None
    return round(max(0.0, (span.finished_at - span.started_at).total_seconds()), 3)


def _timings(result: TrialResult) -> dict[str, float | None]:
    return {
        "environment_setup_sec": _seconds(result.environment_setup),
        "agent_setup_sec": _seconds(result.agent_setup),
        "agent_sec": _seconds(result.agent_execution),
        "verifier_sec": _seconds(result.verifier),
        "total_sec": _seconds(result),
    }


def _metrics(result: TrialResult) -> dict[str, float | int | None]:
    """The trial's usage as Harbor sums it: its agent's, or a multi-step trial's steps' added up."""
    input_tokens, cached_tokens, output_tokens, cost_usd = result.compute_token_cost_totals()
    return {"input_tokens": input_tokens, "cached_tokens": cached_tokens, "output_tokens": output_tokens, "cost_usd": cost_usd}

