"""One dataset row -> one Harbor trial -> one :class:`RowResult`, the Osmosis way.

Nothing here knows about Prefect: the Prefect task in ``tasks/`` wraps
:func:`run_row`, and the benchmark calls it directly as the no-Prefect baseline.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from harbor.models.task.config import NetworkMode, VerifierEnvironmentMode
from harbor.models.task.config import TaskConfig as HarborTaskConfig
from harbor.models.task.verifier_mode import resolve_step_verifier_mode, resolve_task_verifier_mode
from harbor.models.trial.config import EnvironmentConfig, TaskConfig, TrialConfig, VerifierConfig
from harbor.models.trial.result import TrialResult
from harbor.trial.hooks import TrialEvent
from harbor.trial.trial import Trial
from pydantic import ValidationError

from prefect_harbor.agents.harness import BundleRuntime, container_input, harness_agent_config, read_container_result, stage_grader
from prefect_harbor.agents.native import native_agent_config
from prefect_harbor.bounds import read_tail
from prefect_harbor.certification import CERTIFY_FIX
from prefect_harbor.config import DEFAULT_MODEL_NAME, MODELLESS_AGENTS, own_verifier
from prefect_harbor.host import host_name
from prefect_harbor.rows.dataset import DatasetRow, RowProblem, path_safe
from prefect_harbor.rows.sources import ResolvedTask, RowRejected, TaskResolver, declared_task
from prefect_harbor.sandbox.images import BUILD_TIMEOUT_OPTION
from prefect_harbor.sandbox.interpolation import PASSTHROUGH_OPTION
from prefect_harbor.sandbox.limits import trial_pids_limit
from prefect_harbor.sandbox.network import reachable_from_sandbox
from prefect_harbor.spec import BackendSpec, NativeAgent, WorkflowAgent
from prefect_harbor.storage.results import ErrorCategory, RowResult
from prefect_harbor.trial import tampering
from prefect_harbor.trial.bounded_verifier import IMPORT_PATH as BOUNDED_VERIFIER
from prefect_harbor.trial.hosts_tried import hosts_tried
from prefect_harbor.trial.outcome import failure_cause, outcome, verifier_output_tail, workflow_outcome
from prefect_harbor.trial.task_env import refuse_unlisted_host_variables
from prefect_harbor.trial.verifier_isolation import isolate_verifier


@dataclass(frozen=True)
class RunContext:
    """What every row of one sweep run shares: local directories and prepared runtimes."""

    run_id: str
    trials_dir: Path
    #: The workflow bundle and its prepared environment, when the backend has one.
    bundle: BundleRuntime | None = None
    #: Extra read-only mounts every trial's environment needs (prepared agent runtimes).
    mounts: tuple[dict, ...] = ()
    #: Task name -> why its prewarm failed: its rows fail at once with that reason.
    prewarm_failures: dict[str, str] = field(default_factory=dict)
    #: Task folder -> its certification's label, for tasks certified (whatever the verdict) for their current content.
    certifications: dict[str, str] = field(default_factory=dict)
    #: Task folder -> why its rows are not run (Certified Tasks Only): any selected task not certified.
    uncertified: dict[str, str] = field(default_factory=dict)

    @property
    def tasks_copy_dir(self) -> Path:
        return self.trials_dir / "_tasks"

    def input_path(self, trial_name: str) -> Path:
        """The row's container input for the workflow harness (holds the key: deleted after the trial)."""
        return self.tasks_copy_dir / f"{trial_name}.input.json"


def trial_name_for(row_id: str, attempt: int = 1) -> str:
    """Harbor's ``<name>__<short id>``: the row's id (``.a<n>`` added for attempts after the first) and a fresh id.

    It names the attempt's trial directory and its archive, so that a results root is a folder of
    Harbor jobs (``harbor view``)."""
    label = path_safe(row_id) if attempt == 1 else f"{path_safe(row_id)}.a{attempt}"
    return f"{label}__{uuid.uuid4().hex[:7]}"


def prepare_task(
    row: DatasetRow, backend: BackendSpec, task: ResolvedTask, destination: Path, logger: logging.Logger | logging.LoggerAdapter,
    bundle: BundleRuntime | None = None,
) -> Path:  # fmt: skip
    """Copy the row's task to ``destination`` (a private copy per row) and stage the row.

    A task with its own ``tests/test.sh`` is scored by it, even when a grader is configured;
    otherwise the bundle's grader is staged as the verifier.
    """
    validate_task(task, backend)
    shutil.copytree(task.path, destination)
    if backend.scoring.verifier_isolation == "separate":
        isolate_verifier(destination, task.name, list(backend.scoring.verifier_artifacts))
    if backend.sources.mode == "template":
        instruction = destination / "instruction.md"
        if row.prompt:
            if task.dynamic and instruction.is_file():
                logger.warning(f"Row {row.id}: task {task.name} brings its own instruction.md; the row's prompt overwrites it")
            # Byte-for-byte what the Osmosis backend writes: one line, ASCII-escaped.
            instruction.write_text(json.dumps(row.prompt, default=str))
        elif not instruction.is_file():
            raise RowRejected(f"task {task.name} has no instruction and no prompt")
    if own_verifier(destination) is None and bundle is not None and bundle.bundle.grader_script:
        stage_grader(destination, bundle, container_input(row.id, prompt_of(row, backend), row.metadata, label_text(row.label), "", None))
    return destination


def validate_task(task: ResolvedTask, backend: BackendSpec) -> str:
    """Refuse a task before it is copied for a row; return its reward source.

    Shared with ``prefect-harbor check``: a link could point out of the task, an unreadable
    task.toml would only fail inside ``Trial.create``, and a task without a reward source
    would only fail after its trial ran.
    """
    source = task.path
    for path in [source, *source.rglob("*")]:
        if path.is_symlink():
            raise RowRejected(f"task {task.name!r} contains a symlink ({path.relative_to(source)}); tasks must be plain files")
    if problem := _task_toml_problem(source / "task.toml"):
        raise RowRejected(f"task {task.name!r}: its task.toml cannot be loaded ({problem}); fix it so Harbor can read the task")
    if backend.environment.is_local_sandbox and (accelerators := _accelerators(source / "task.toml")):
        raise RowRejected(
            f"task {task.name!r}: [environment] {accelerators}: the local container sandbox gives trials no GPU or TPU. Run it where "
            "one is: a Harbor environment that has them (the backend's environment type, e.g. a cloud sandbox), on a work pool of "
            "such hosts (sweep --shards); or drop the key if the task does not need it."
        )
    if backend.environment.is_local_sandbox and (switch := _phase_network_switch(source / "task.toml")):
        raise RowRejected(
            f"task {task.name!r}: {switch}: the local container sandbox starts a trial with a network ('public') or without one "
            "('no-network', 'allowlist': its phases switch between those two) and cannot change that while the trial runs. Give the "
            "phases the [environment]'s kind of network_mode, or run the task in a Harbor environment that switches networks between phases."
        )
    refuse_unlisted_host_variables(source, task.name, backend.environment.task_env_passthrough)
    if verifier := own_verifier(source):
        return verifier
    if backend.scoring.grader is None:
        raise RowRejected(f"task {task.name!r} has no reward source: no tests/test.sh and no grader configured")
    return f"grader {backend.scoring.grader}"


def _accelerators(path: Path) -> str | None:
    """The task's ``[environment]`` keys asking for GPUs or TPUs (``gpus = 1``), as the task says them, or None."""
    environment = HarborTaskConfig.model_validate_toml(path.read_text()).environment
    asked = {"gpus": environment.gpus or None, "gpu_types": environment.gpu_types or None, "tpu": environment.tpu and environment.tpu.model_dump()}
    return ", ".join(f"{key} = {value!r}" for key, value in asked.items() if value is not None) or None


def _phase_network_switch(path: Path) -> str | None:
    """The first phase whose own ``network_mode`` needs a network the environment's has not, or
    none where it has one ('public' against 'no-network'/'allowlist'; a shared verifier's
    included, a separate verifier has an environment of its own), as the task says it, or None."""
    config = HarborTaskConfig.model_validate_toml(path.read_text())
    baseline = config.environment.network_mode
    phases = [("[agent]", config.agent)]
    if resolve_task_verifier_mode(config) != VerifierEnvironmentMode.SEPARATE:
        phases.append(("[verifier]", config.verifier))
    for step in config.steps or []:
        phases.append((f"[steps.agent] of step {step.name!r}", step.agent))
        if resolve_step_verifier_mode(config, step) != VerifierEnvironmentMode.SEPARATE:
            phases.append((f"[steps.verifier] of step {step.name!r}", step.verifier))
    for where, phase in phases:
        if phase.network_mode is not None and (phase.network_mode == NetworkMode.PUBLIC) != (baseline == NetworkMode.PUBLIC):
            return f"{where} network_mode = {phase.network_mode.value!r} differs from [environment] network_mode = {baseline.value!r}"
    return None


def _task_toml_problem(path: Path) -> str | None:
    """Why Harbor could not load this task.toml (as ``Trial.create`` does), or None."""
    try:
        HarborTaskConfig.model_validate_toml(path.read_text())
    except ValidationError as error:
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    except (OSError, ValueError) as error:  # tomllib's decode error is a ValueError
        return str(error)
    return None


def prompt_of(row: DatasetRow, backend: BackendSpec) -> list:
    """The prompt a workflow receives: the row's in template mode; in dataset mode the task's instruction (added in the trial)."""
    if backend.sources.mode != "template" or not row.prompt:
        return []
    return row.prompt


def label_text(label: object) -> str | None:
    """Osmosis labels are strings: other JSON values are passed as their JSON text."""
    return label if label is None or isinstance(label, str) else json.dumps(label)


def stage_workflow_input(row: DatasetRow, backend: BackendSpec, path: Path) -> None:
    """Write the row's container input for the harness: prompt, metadata, endpoint; the label stays out."""
    endpoint = backend.model.endpoint
    key = endpoint.api_key.get_secret_value() if endpoint is not None and endpoint.api_key is not None else None
    chat_url = reachable_from_sandbox(endpoint.base_url) if endpoint else ""  # the workflow calls it from inside the container
    document = container_input(row.id, prompt_of(row, backend), row.metadata, None, chat_url, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, default=str))
    path.chmod(0o600)


def bakes_the_bundle(backend: BackendSpec, run: RunContext) -> bool:
    """``patch_dockerfile_with_sdk`` (on by default with a bundle): its environment goes into the task image."""
    return run.bundle is not None and backend.environment.is_local_sandbox and (backend.bundle is None or backend.bundle.bake)


def task_environment_kwargs(backend: BackendSpec) -> dict:
    """The environment's options as the backend sets them; in the local sandbox with the backend's
    ``task_env_passthrough``, the host variables a task's compose file may read (as its task.toml may)."""
    kwargs = dict(backend.environment.kwargs)
    if backend.environment.is_local_sandbox and backend.environment.task_env_passthrough:
        kwargs[PASSTHROUGH_OPTION] = list(backend.environment.task_env_passthrough)
    if backend.environment.is_local_sandbox and backend.limits.timeouts.build != 1.0:
        kwargs[BUILD_TIMEOUT_OPTION] = backend.limits.timeouts.build  # its builds run inside Harbor's (multiplied) start timeout
    return kwargs


def environment_kwargs(backend: BackendSpec, run: RunContext) -> dict:
    """The environment's options for this run's trials (and its prewarm, which must build the same image).

    The local sandbox gets the per-trial process limit that fits this host's budget at the run's
    trials at once (:func:`~prefect_harbor.sandbox.limits.trial_pids_limit`; the flow checked it first)."""
    kwargs = task_environment_kwargs(backend)
    if backend.environment.is_local_sandbox:
        kwargs["pids_limit"] = trial_pids_limit(kwargs.get("pids_limit"), backend.limits.n_concurrent)
    if bakes_the_bundle(backend, run):
        assert run.bundle is not None
        kwargs["baked_paths"] = run.bundle.env.baked()
    return kwargs


def build_trial_config(backend: BackendSpec, row: DatasetRow, task_path: Path, run: RunContext, trial_name: str) -> TrialConfig:
    model_name = model_for(backend, row)
    baked = bakes_the_bundle(backend, run)
    mounts = [*run.mounts, *(run.bundle.env.mounts() if run.bundle and not baked else [])]
    if isinstance(backend.agent, NativeAgent):
        setup = native_agent_config(backend.agent.name, model_name, backend.model.endpoint, backend.agent.options)
        agent = setup.agent
        mounts += [m for m in setup.mounts if m not in mounts]
    else:
        if run.bundle is None:
            raise RowRejected("a workflow agent needs its bundle, and none was prepared for this run")
        agent = harness_agent_config(run.bundle, run.input_path(trial_name), model_name)
    if backend.limits.agent_setup_timeout_sec is not None:
        agent.override_setup_timeout_sec = backend.limits.agent_setup_timeout_sec
    environment = backend.environment
    return TrialConfig(
        task=TaskConfig(path=task_path),
        trials_dir=run.trials_dir,
        trial_name=trial_name,
        agent=agent,
        environment=EnvironmentConfig(
            type=environment.type, import_path=environment.import_path, kwargs=environment_kwargs(backend, run), mounts=mounts or None,
            force_build=environment.force_build,
        ),  # fmt: skip
        verifier=VerifierConfig(import_path=BOUNDED_VERIFIER),
        **backend.limits.timeouts.trial_config(),
    )


def model_for(backend: BackendSpec, row: DatasetRow | None) -> str | None:
    """The row's model: ``metadata.harbor_model`` (native agents), else the backend's, else the endpoint's default.

    Oracle and nop need none. Without a row: the model rows get when they name none.
    """
    native = backend.native
    if native is not None and native.name in MODELLESS_AGENTS:
        return None
    override = row.metadata.get("harbor_model") if native is not None and row is not None else None
    if override:
        return str(override)
    endpoint = backend.model.endpoint
    if backend.model.name == DEFAULT_MODEL_NAME and endpoint is not None and endpoint.model:
        return endpoint.model
    return backend.model.name


def base_result(row: DatasetRow | RowProblem, index: int, backend: BackendSpec, attempt: int = 1) -> RowResult:
    """The attempt's result before anything ran (a failure until a trial says otherwise)."""
    if isinstance(row, RowProblem):
        return RowResult(row_index=index, row_id=row.id, attempt=attempt, agent=backend.agent_name, status="failure")
    return RowResult(
        row_index=index, row_id=row.id, attempt=attempt, task=declared_task(row, backend.sources), agent=backend.agent_name, model=model_for(backend, row), status="failure"
    )


async def run_row(
    row: DatasetRow | RowProblem, index: int, trial_name: str, backend: BackendSpec, resolver: TaskResolver,
    run: RunContext, logger: logging.Logger | logging.LoggerAdapter, on_grading: Callable[[], None] | None = None, attempt: int = 1,
) -> RowResult:  # fmt: skip
    """Run one attempt at a row: its own trial. Returns a result for every outcome except cancellation."""
    base = base_result(row, index, backend, attempt).model_copy(update={"host": host_name()})
    if isinstance(row, RowProblem):
        return base.model_copy(update={"err_category": "validation_error", "err_message": row.reason, "err_phase": "setup"})
    started = datetime.now().astimezone()
    try:
        task = await resolver.resolve(row)
        base = base.model_copy(update={"task": task.name, "trial_name": trial_name, "certification": run.certifications.get(str(task.path))})
        if task.name in run.prewarm_failures:
            raise RowRejected(f"task {task.name} failed prewarm: {run.prewarm_failures[task.name]}")
        if backend.scoring.certified_tasks_only and (str(task.path) in run.uncertified or str(task.path) not in run.certifications):
            why = run.uncertified.get(str(task.path)) or f"task {task.name} ({task.path}) is not under tasks_dir, so it cannot be certified; {CERTIFY_FIX}"
            raise RowRejected(why, phase="certification")
        task_path = await asyncio.to_thread(prepare_task, row, backend, task, run.tasks_copy_dir / trial_name, logger, run.bundle)
        if isinstance(backend.agent, WorkflowAgent):
            await asyncio.to_thread(stage_workflow_input, row, backend, run.input_path(trial_name))
        trial = await Trial.create(build_trial_config(backend, row, task_path, run, trial_name))
    except RowRejected as rejected:
        return _failed(base, rejected.category, str(rejected), started, phase=rejected.phase)
    except Exception as error:  # Trial.create raises whatever the task or environment raised
        return _failed(base, "validation_error", f"{type(error).__name__}: {error}", started, type(error).__name__)
    if on_grading is not None:

        async def grading(event: object) -> None:
            on_grading()

        trial.add_hook(TrialEvent.VERIFICATION_START, grading)
    try:
        result = await trial.run()
    finally:
        run.input_path(trial_name).unlink(missing_ok=True)
        forget_loggers(trial.logger.name)
    trial_dir = run.trials_dir / trial_name
    row_result = outcome(base, result, backend.scoring.reward_key, backend.scoring.reward_range)
    if row_result.err_category == "verifier_error":
        row_result.err_message = f"{row_result.err_message}{verifier_output_tail(trial_dir)}"
    if isinstance(backend.agent, WorkflowAgent):
        row_result = workflow_outcome(row_result, read_container_result(trial_dir / "agent"), read_tail(trial_dir / "verifier" / "test-stdout.txt"))
    row_result = tampering.judge(row_result, trial_dir, backend.scoring.on_tampering)
    row_result.hosts_tried = hosts_tried(trial_dir)
    row_result.trial_dir = str(trial_dir)
    return row_result


def forget_loggers(name: str) -> None:
    """Drop a finished trial's loggers from :mod:`logging`'s registry.

    Harbor names a logger after each trial (and its agent's under it); logging keeps every
    named logger for the life of the process: ~8 entries per row, the sweep's only memory that
    grew with the rows done (``docs/performance.md``). Call it on the event loop's thread.
    """
    registry = logging.Logger.manager.loggerDict
    gone: list[Any] = [registry.pop(n) for n in [n for n in registry if n == name or n.startswith(f"{name}.")]]  # loggers and placeholders
    for holder in registry.values():  # a placeholder (a name with no logger of its own) lists its children
        if isinstance(holder, logging.PlaceHolder):
            for logger in gone:
                holder.loggerMap.pop(logger, None)






def cancelled_result(base: RowResult, run: RunContext | None, trial_name: str | None, started: bool) -> RowResult:
    """The result of a row the sweep cancelled: from Harbor's result.json when the trial ran."""
    message = "cancelled while running" if started else "cancelled before it started"
    if started:  # it ran here: on many hosts, which one stopped it
        base = base.model_copy(update={"host": host_name()})
    result_json = run.trials_dir / trial_name / "result.json" if run and trial_name else None
    if result_json is not None and result_json.is_file():
        try:
            recorded = outcome(base, TrialResult.model_validate_json(result_json.read_text()))
        except ValueError:
            recorded = base
        return recorded.model_copy(
            update={"status": "cancelled", "err_message": message, "err_category": None, "trial_name": trial_name, "trial_dir": str(result_json.parent)}
        )
    return base.model_copy(update={"status": "cancelled", "err_message": message, "err_phase": "setup" if not started else None})


def release_trial(result: RowResult, backend: BackendSpec, run: RunContext) -> RowResult:
    """After archiving: delete a successful row's local trial (and task copy) if configured."""
    if result.trial_name is None or result.status != "success" or not backend.cleanup_successful_trials:
        return result
    _remove(run.trials_dir / result.trial_name, run.tasks_copy_dir / result.trial_name)
    return result.model_copy(update={"trial_dir": None})


def _failed(
    base: RowResult, category: ErrorCategory, message: str, started: datetime, exception_type: str | None = None, phase: str = "setup"
) -> RowResult:
    return base.model_copy(
        update={
            "err_category": category,
            "err_message": message,
            "err_phase": phase,
            "exception_type": exception_type,
            "failure_cause": failure_cause(exception_type),
            "started_at": started,
            "finished_at": datetime.now().astimezone(),
        }
    )




























def _remove(*paths: Path) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
