"""The backend configuration block: every knob of Osmosis's ``HarborBackend``."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

from prefect.blocks.core import Block
from pydantic import Field, field_validator, model_validator

from prefect_harbor.blocks.endpoint import ModelEndpoint
from prefect_harbor.config import (
    DEFAULT_MODEL_NAME,
    MODEL_AGENTS,
    NATIVE_AGENTS,
    ConfigurationError,
    TaskMode,
    TaskSourcePolicy,
    TrialEnvironment,
    default_trials_dir,
    own_verifier,
    reject_legacy_keywords,
)
from prefect_harbor.spec import BackendSpec, BundleSource, Environment, Limits, Model, NativeAgent, Scoring, Sources, TimeoutMultipliers, WorkflowAgent
from prefect_harbor.stats.stopping import check_stopping
from prefect_harbor.storage.archive import ArchiveLimits, MiB
from prefect_harbor.task_folders import is_task, tasks_in
from prefect_harbor.trial import reward_key
from prefect_harbor.trial.tampering import OnTampering

#: An AgentWorkflow's import path ``module:Class``.
WORKFLOW_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"


def _constrain_non_null(schema: dict, **rules: Any) -> None:
    """Put ``rules`` on the non-null branch of an optional field's schema, where the UI's validation looks."""
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") != "null":
            branch.update(rules)


def _as_plain_enum(schema: dict, choices: tuple[str, ...]) -> None:
    """Describe an optional field as a plain enum, so the UI draws one list (as for Task Mode), not a string/null switch."""
    schema.pop("anyOf", None)
    schema.update(type="string", enum=list(choices))


class HarborBackend(Block):
    """How a sweep runs each row: the task(s), the agent, how it is scored and where.

    Mirrors the constructor of Osmosis SDK v0.3's ``HarborBackend``; the rules it
    enforces are checked when the block is created, saved or loaded, and again when a
    sweep starts, so a bad configuration fails before any trial. A flow hands the core
    :meth:`spec`, never the block.
    """

    _block_type_name = "Harbor Backend"
    _description = "Backend configuration for Harbor evaluation sweeps: tasks, agent, grader, environment and capacity."

    tasks_dir: Path = Field(title="Tasks Directory", description="Template mode: one Harbor task directory. Dataset mode: a folder of task directories.")
    task_mode: TaskMode = Field(
        default=None,  # type: ignore[arg-type]  # empty in the form; the validator fills it before any use
        title="Task Mode",
        description=(
            "'template': every row runs a copy of tasks_dir with the row's prompt as instruction.md. 'dataset': metadata.harbor_task_id "
            "picks a task under tasks_dir. Empty: template when tasks_dir is one task (it has task.toml), dataset when it is a folder of tasks."
        ),
    )
    agent: str | None = Field(
        default=None,
        title="Agent",
        description="A native Harbor agent: terminus-2, mini-swe-agent, oracle or nop (does nothing). For an Osmosis AgentWorkflow, leave it empty and set Workflow Agent.",
        # An enum in the schema, so the UI offers a list and cannot save a typo ("orcale"); Python
        # gets the validator's message, and agent='module:Class' still works there (see _workflow_from_agent).
        json_schema_extra=lambda schema: _as_plain_enum(schema, NATIVE_AGENTS),
    )
    workflow_agent: str | None = Field(
        default=None,
        title="Workflow Agent",
        description="An Osmosis AgentWorkflow to run instead of a native agent, as an import path 'module:Class'.",
        json_schema_extra=lambda schema: _constrain_non_null(schema, pattern=WORKFLOW_PATTERN),
    )
    native_agent_kwargs: dict[str, Any] = Field(title="Native Agent Options", default_factory=dict, description="Keyword arguments for a native agent (not for workflow agents).")
    model_name: str = Field(title="Model", default=DEFAULT_MODEL_NAME, description="Model for model-backed agents; a row's metadata.harbor_model overrides it.")
    model_endpoint: ModelEndpoint | None = Field(
        default=None, title="Model Endpoint", description="Where model-backed agents (terminus-2, mini-swe-agent, workflows) send requests; its key is never stored in results."
    )
    grader: str | None = Field(title="Grader", default=None, description="An Osmosis Grader import path 'module:Class', used when a task has no tests/test.sh.")
    workflow_config: str | None = Field(title="Workflow Config", default=None, description="Import path 'module:attr' of the workflow's config, re-imported in the sandbox.")
    grader_config: str | None = Field(title="Grader Config", default=None, description="Import path 'module:attr' of the grader's config, re-imported in the sandbox.")
    code_dir: Path | None = Field(title="Workflow Project Directory", default=None, description="The workflow's project (pyproject.toml plus one package); inferred "
        "from the workflow when omitted.")
    bundle: Path | None = Field(title="Prebuilt Bundle Wheel", default=None, description="A prebuilt bundle wheel to use instead of building code_dir.")
    environment: TrialEnvironment = Field(title="Trial Environment", default_factory=TrialEnvironment, description="The Harbor environment trials run in.")
    force_build: bool = Field(
        title="Build Task Images from their Dockerfiles",
        default=False,
        description=(
            "Build each task's image from its environment/Dockerfile even when its task.toml names a prebuilt docker_image "
            "(Harbor's force_build, as harbor run --force-build). Off: the prebuilt image is used when it can be had, else the Dockerfile is built."
        ),
    )
    trials_dir: str = Field(title="Trials Directory", default_factory=default_trials_dir, description="Local folder for Harbor trial directories; empty: "
        "prefect-harbor/trials under the system temporary folder (/tmp).")
    cleanup_successful_trials: bool = Field(title="Delete Successful Trial Directories", default=True, description="Delete a successful row's local trial directory "
        "after archiving.")
    patch_dockerfile_with_sdk: bool | None = Field(
        title="Preinstall the Bundle in Task Images",
        default=None, description="Preinstall the bundle's requirements once per task image (default: on whenever there is a bundle)."
    )
    agent_setup_timeout_sec: float | None = Field(title="Agent Setup Timeout (s)", default=None, gt=0, description="Override for the agent setup (install) timeout, in seconds.")
    timeout_multiplier: float = Field(
        title="Timeout Multiplier", default=1.0, gt=0,
        description="Multiplies every task timeout (agent, verifier, agent setup, image build), as harbor run --timeout-multiplier; a phase's own multiplier below wins.",
    )  # fmt: skip
    agent_timeout_multiplier: float | None = Field(title="Agent Timeout Multiplier", default=None, gt=0, description="Multiplies the task's agent timeout_sec instead.")
    verifier_timeout_multiplier: float | None = Field(title="Verifier Timeout Multiplier", default=None, gt=0, description="Multiplies the task's verifier timeout_sec instead.")
    agent_setup_timeout_multiplier: float | None = Field(title="Agent Setup Timeout Multiplier", default=None, gt=0, description="Multiplies the agent setup timeout instead.")
    environment_build_timeout_multiplier: float | None = Field(
        title="Environment Build Timeout Multiplier", default=None, gt=0, description="Multiplies the task's build_timeout_sec instead (prewarm's builds too)."
    )
    max_queue_depth: int | None = Field(
        title="Max Queue Depth",
        default=None,
        json_schema_extra=lambda schema: _constrain_non_null(schema, minimum=1),
        description="Osmosis's bound on rows admitted but not yet running (at least 1). A sweep admits a row only when a trial slot is free, so no row ever waits "
            "admitted; kept for compatibility.",
    )
    n_concurrent: int = Field(title="Trials at Once", default=4, ge=1, le=256, description="Trials running at once (Harbor TrialQueue n_concurrent).")
    attempts: int = Field(
        title="Attempts per Row",
        default=1,
        ge=1,
        description="Independent trials per dataset row (Harbor's n_attempts): each attempt has its own result row and archive; pass@k is reported for k up to this.",
    )
    stop_at_ci_width: float | None = Field(
        title="Stop at Interval Width",
        default=None,
        json_schema_extra=lambda schema: _constrain_non_null(schema, exclusiveMinimum=0),
        description=(
            "Run the attempts in rounds (every row's attempt 1, then every row's attempt 2, ...) and stop after the round whose mean "
            "has a 95% interval this narrow or narrower; Attempts per Row is then the most it may run (2 or more). Empty: run every attempt."
        ),
    )
    not_scored_retries: int = Field(
        title="Retries of a Not-Scored Attempt",
        default=2,
        ge=0,
        le=10,
        description=(
            "How many more times an attempt is tried when it measured nothing for a cause that may pass (its sandbox failed, or the model "
            "endpoint: Harbor's error policy says retry), after a wait that doubles from Retry Wait; then it stays not scored. "
            "0: never. A scored attempt or an agent failure is never tried again."
        ),
    )
    retry_wait_sec: float = Field(
        title="Retry Wait (s)", default=5.0, ge=0, le=600, description="The wait before an attempt's second try; each further try waits twice as long (at most 10 minutes)."
    )
    task_sources: TaskSourcePolicy = Field(title="Task Sources Rows May Name", default_factory=TaskSourcePolicy, description="Which per-row task sources "
        "(metadata.harbor_task) are honoured.")
    reward_key: str = Field(
        default=reward_key.DEFAULT,
        title="Reward Key",
        description=(
            "Which verifier key is the row's reward: 'reward' (the only one Osmosis counts), another key, or mean(k1, k2) / min(k1, k2) "
            "of named keys, for Harbor-native datasets that write several. Every key is kept in the rewards column."
        ),
        json_schema_extra={"pattern": reward_key.PATTERN},
    )
    task_env_passthrough: list[str] = Field(
        default_factory=list,
        title="Host Variables Tasks May Read",
        description=(
            "Host environment variables a task.toml may pull in with ${VAR} templates ([environment.env], [solution.env], "
            "[verifier.env]), and its docker-compose.yaml with ${VAR}. Empty by default: a task is someone else's data; a task.toml "
            "asking for any other variable fails its rows, and in compose any other is empty (or its default), with a warning."
        ),
    )
    on_tampering: OnTampering = Field(
        default="flag",
        title="On Verifier Tampering",
        description=(
            "What evidence that the agent tampered with its verifier (shared mode: a reward file planted or rewritten, a program "
            "the tests run replaced) does to its row: 'flag' keeps the outcome and lists the evidence in verifier_tampering; "
            "'fail' makes the row a failure of category verifier_tampering."
        ),
    )
    certified_tasks_only: bool = Field(
        default=False,
        title="Certified Tasks Only",
        description=(
            "Run only tasks certified for their current content (prefect-harbor certify: the oracle always rewarded, doing nothing "
            "never) in the same results storage; the rows of any other task are not scored, with the task's verdict as the reason."
        ),
    )
    reward_range: Literal["finite"] | list[float] = Field(
        default="finite",
        title="Reward Range",
        description="'finite': any finite reward counts. [low, high], e.g. [0, 1]: a reward outside it fails its row as a verifier_error.",
    )
    verifier_isolation: Literal["shared", "separate"] = Field(
        default="shared",
        title="Verifier Isolation",
        description=(
            "'shared' (Harbor's default): a task's verifier runs where its task says, usually in the agent's container. 'separate': a "
            "shared-mode task is verified in a fresh container of its own image, which receives only its workdir (or Verifier "
            "Artifacts) copied from the agent's; tasks whose tests need what the agent left running or installed elsewhere fail."
        ),
    )
    verifier_artifacts: list[str] = Field(
        default_factory=list,
        title="Verifier Artifacts",
        description="With verifier_isolation 'separate': the absolute paths copied from the agent's container into the verifier's. Empty: each task's workdir.",
    )
    archive_max_file_mb: int = Field(
        default=50, ge=1, title="Archive Limit per File (MiB)", description="Files of a trial larger than this are cut to it in the row's archive."
    )
    archive_max_row_mb: int = Field(
        default=500, ge=1, title="Archive Limit per Row (MiB)", description="Once a row's archive holds this much, its remaining files are skipped (and listed)."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_legacy_keywords(cls, data: Any) -> Any:
        reject_legacy_keywords(data)
        return data

    @model_validator(mode="before")
    @classmethod
    def _workflow_from_agent(cls, data: Any) -> Any:
        """Osmosis's ``agent=`` takes a workflow's 'module:Class' too: store it as workflow_agent."""
        if isinstance(data, dict) and ":" in str(data.get("agent") or ""):
            if data.get("workflow_agent") not in (None, "", data["agent"]):
                raise ConfigurationError(f"agent: {data['agent']!r} is a workflow and workflow_agent is {data['workflow_agent']!r}; give one of them.")
            data = {**data, "agent": None, "workflow_agent": data["agent"]}
        return data

    @model_validator(mode="after")
    def _stopping_rule_has_attempts(self) -> HarborBackend:
        check_stopping(self.stop_at_ci_width, self.attempts)
        return self

    @field_validator("model_endpoint", mode="before")
    @classmethod
    def _empty_endpoint_is_none(cls, value: Any) -> Any:
        # The Prefect UI submits an untouched optional nested block as {}.
        return None if isinstance(value, dict) and not any(v not in (None, "") for v in value.values()) else value

    @model_validator(mode="before")
    @classmethod
    def _mode_from_tasks_dir(cls, data: Any) -> Any:
        """One default everywhere (block, CLI, code): the mode tasks_dir's shape implies."""
        if isinstance(data, dict) and data.get("task_mode") in (None, "") and data.get("tasks_dir"):
            tasks_dir = Path(str(data["tasks_dir"])).expanduser()
            data = {**data, "task_mode": "template" if is_task(tasks_dir) else "dataset"}
        return data

    @field_validator("tasks_dir")
    @classmethod
    def _tasks_dir_exists(cls, value: Path) -> Path:
        value = value.expanduser()
        if not value.is_dir():
            raise ConfigurationError(
                f"tasks_dir: {value} is not a directory; point it at a Harbor task (template mode) or a folder of tasks (dataset mode)."
            )
        return value.resolve()

    @field_validator("reward_range")
    @classmethod
    def _reward_range_is_a_range(cls, value: str | list[float]) -> str | list[float]:
        if isinstance(value, list) and not (len(value) == 2 and all(math.isfinite(v) for v in value) and value[0] <= value[1]):
            raise ConfigurationError(f"reward_range: {value!r} is not [low, high] with finite low <= high; give e.g. [0, 1], or 'finite'.")
        return value

    @field_validator("verifier_artifacts")
    @classmethod
    def _verifier_artifacts_are_absolute(cls, value: list[str]) -> list[str]:
        relative = [path for path in value if not path.startswith("/")]
        if relative:
            raise ConfigurationError(f"verifier_artifacts: {relative} are not absolute paths in the container; give e.g. ['/app'].")
        return value

    @field_validator("reward_key")
    @classmethod
    def _reward_key_parses(cls, value: str) -> str:
        reward_key.parse(value)
        return value.strip()

    @field_validator("agent")
    @classmethod
    def _agent_is_known(cls, value: str | None) -> str | None:
        if value is not None and value not in NATIVE_AGENTS:
            raise ConfigurationError(
                f"agent: unknown native agent {value!r}; choose one of {list(NATIVE_AGENTS)}, or set workflow_agent to an AgentWorkflow 'module:Class'."
            )
        return value

    @field_validator("workflow_agent")
    @classmethod
    def _workflow_is_an_import_path(cls, value: str | None) -> str | None:
        if value is not None and not re.match(WORKFLOW_PATTERN, value.strip()):
            raise ConfigurationError(f"workflow_agent: {value!r} is not an import path 'module:Class' (for example 'my_project.workflow:MyWorkflow').")
        return None if value is None else value.strip()

    @field_validator("max_queue_depth")
    @classmethod
    def _queue_depth_is_enforceable(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ConfigurationError("max_queue_depth: must be >= 1, or empty for unbounded.")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> HarborBackend:
        if self.agent is not None and self.workflow_agent is not None:
            raise ConfigurationError(f"agent: {self.agent} is a native agent and workflow_agent is {self.workflow_agent}; set one of them.")
        if self.agent is None and self.workflow_agent is None and self.bundle is None:
            raise ConfigurationError("agent: set a native agent, or workflow_agent ('module:Class'), or a bundle= wheel that provides one.")
        if self.native_agent_kwargs and not self.is_native:
            raise ConfigurationError("native_agent_kwargs: configures native Harbor agents only; workflow agents take workflow_config.")
        if self.agent in MODEL_AGENTS and self.model_endpoint is None:
            raise ConfigurationError(
                f"model_endpoint: {self.agent} needs a model endpoint; set model_endpoint (a Model Endpoint block), "
                "or pass --model-endpoint BLOCK or --model-base-url URL --model-api-key-env VAR."
            )
        if not self.environment.is_local_sandbox and (self.has_bundle or self.agent == "mini-swe-agent"):
            what = "a workflow bundle" if self.has_bundle else "mini-swe-agent's prepared environment"
            raise ConfigurationError(
                f"environment: {what} is mounted from this host into the local container sandbox (or baked into its images), which environment "
                f"{self.environment.type or self.environment.import_path!r} cannot do; use the default sandbox, or a native agent without a grader."
            )
        if self.workflow_config and self.is_native:
            raise ConfigurationError("workflow_config: configures an AgentWorkflow agent ('module:Class'); native agents take native_agent_kwargs.")
        if self.grader_config and self.grader is None:
            raise ConfigurationError("grader_config: configures a grader; set grader ('module:Class') or unset it.")
        if self.bundle is not None and self.code_dir is not None:
            raise ConfigurationError("bundle: a prebuilt wheel replaces building code_dir; give one of them.")
        if self.bundle is None and self.code_dir is not None and not self.has_bundle:
            raise ConfigurationError("code_dir: only used to build a workflow bundle; set a workflow agent ('module:Class') or a grader, or unset it.")
        if self.verifier_artifacts and self.verifier_isolation != "separate":
            raise ConfigurationError("verifier_artifacts: only used with verifier_isolation 'separate'; set it, or empty verifier_artifacts.")
        if self.patch_dockerfile_with_sdk and not self.has_bundle:
            raise ConfigurationError("patch_dockerfile_with_sdk: needs a bundle (a workflow agent, a grader, or bundle=); unset it.")
        self._check_tasks_dir()
        return self

    def _check_tasks_dir(self) -> None:
        one_task = is_task(self.tasks_dir)
        if self.task_mode == "template":
            if not one_task:
                raise ConfigurationError(f"tasks_dir: {self.tasks_dir} has no task.toml; template mode needs one Harbor task directory.")
            if self.grader is None and own_verifier(self.tasks_dir) is None:
                raise ConfigurationError(
                    f"tasks_dir: task {self.tasks_dir.name} has no reward source: add tests/test.sh to it, or configure a grader."
                )
            return
        if one_task:
            raise ConfigurationError(f"tasks_dir: {self.tasks_dir} is a single task; use task_mode 'template', or point tasks_dir at its parent folder.")
        tasks = list(tasks_in(self.tasks_dir).values())
        terminal_bench = [child for child in self.tasks_dir.iterdir() if (child / "task.yaml").is_file()]
        if not tasks and not terminal_bench:
            raise ConfigurationError(f"tasks_dir: {self.tasks_dir} holds no task directories (sub-folders with task.toml, or Terminal-Bench's task.yaml).")
        if self.grader is None and not terminal_bench and not any(own_verifier(task) for task in tasks):
            raise ConfigurationError(f"tasks_dir: no task under {self.tasks_dir} has tests/test.sh and no grader is configured: there is no reward source.")

    @property
    def is_native(self) -> bool:
        return self.agent is not None

    @property
    def agent_spec(self) -> str | None:
        """What runs each row, as Osmosis's ``agent=`` names it: a native agent or a workflow's 'module:Class'."""
        return self.agent or self.workflow_agent

    @property
    def has_bundle(self) -> bool:
        """Whether a workflow bundle exists: a workflow agent, a grader, or a prebuilt wheel."""
        return self.bundle is not None or self.workflow_agent is not None or self.grader is not None

    @property
    def is_workflow(self) -> bool:
        """Whether the agent is an Osmosis AgentWorkflow run by the harness (not a native agent)."""
        return not self.is_native

    def spec(self) -> BackendSpec:
        """This configuration as the core takes it: resolved once, frozen, the agent a union (``prefect_harbor.spec``)."""
        environment = self.environment
        agent: NativeAgent | WorkflowAgent = (
            NativeAgent(name=self.agent, options=self.native_agent_kwargs)  # type: ignore[arg-type]  # _agent_is_known checked the name
            if self.agent is not None
            else WorkflowAgent(workflow=self.workflow_agent, config=self.workflow_config)
        )
        return BackendSpec(
            sources=Sources(tasks_dir=self.tasks_dir, mode=self.task_mode, **{k: tuple(v) for k, v in self.task_sources.model_dump().items()}),
            agent=agent,
            model=Model(name=self.model_name, endpoint=None if self.model_endpoint is None else self.model_endpoint.spec()),
            environment=Environment(
                type=environment.type, import_path=environment.import_path, kwargs=dict(environment.kwargs), force_build=self.force_build,
                task_env_passthrough=tuple(self.task_env_passthrough),
            ),
            scoring=Scoring(
                grader=self.grader, grader_config=self.grader_config, reward_key=self.reward_key, reward_range=self.reward_range, on_tampering=self.on_tampering,
                verifier_isolation=self.verifier_isolation, verifier_artifacts=tuple(self.verifier_artifacts),
                certified_tasks_only=self.certified_tasks_only,
            ),
            limits=Limits(
                n_concurrent=self.n_concurrent, attempts=self.attempts, stop_at_ci_width=self.stop_at_ci_width, agent_setup_timeout_sec=self.agent_setup_timeout_sec,
                timeouts=TimeoutMultipliers(
                    overall=self.timeout_multiplier, agent=self.agent_timeout_multiplier, verifier=self.verifier_timeout_multiplier,
                    agent_setup=self.agent_setup_timeout_multiplier, environment_build=self.environment_build_timeout_multiplier,
                ),
                not_scored_retries=self.not_scored_retries, retry_wait_sec=self.retry_wait_sec,
                archive=ArchiveLimits(file_bytes=self.archive_max_file_mb * MiB, row_bytes=self.archive_max_row_mb * MiB),
            ),
            bundle=BundleSource(wheel=self.bundle, code_dir=self.code_dir, bake=self.patch_dockerfile_with_sdk is not False) if self.has_bundle else None,
            trials_dir=self.trials_dir,
            cleanup_successful_trials=self.cleanup_successful_trials,
        )

    def revalidated(self) -> HarborBackend:
        """Check the configuration again against the filesystem as it is now."""
        return type(self).model_validate(self.model_dump())
