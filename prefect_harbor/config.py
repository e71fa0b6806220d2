"""Configuration pieces shared by the blocks, the CLI and the trial runner.

The backend configuration is typed into the :class:`~prefect_harbor.blocks.HarborBackend`
block and reaches the core as :class:`~prefect_harbor.spec.BackendSpec`; this module holds
what the block is made of and the rules it enforces, so that every configuration error
names the field and the fix before any trial starts.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal, get_args

from harbor.models.environment_type import EnvironmentType
from harbor.models.task.config import TaskConfig
from harbor.models.task.verifier_mode import VerifierEnvironmentDefinition
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from prefect_harbor.sandbox import IMPORT_PATH as SANDBOX_IMPORT_PATH
from prefect_harbor.sandbox.separate_verifier import verifier_environments

TaskMode = Literal["template", "dataset"]
#: Set (by ``prefect-harbor sweep --verbose``, or by hand for serve and workers) to keep
#: Harbor's own per-trial log lines on the console; they are always in each trial's trial.log.
VERBOSE_VARIABLE = "PREFECT_HARBOR_VERBOSE"
#: The native Harbor agents the Osmosis backend binds by name, and Harbor's ``nop`` (does nothing: ``certify`` runs it).
NativeAgentName = Literal["terminus-2", "mini-swe-agent", "oracle", "nop"]
NATIVE_AGENTS: tuple[str, ...] = get_args(NativeAgentName)
#: Native agents that call a model, and so need a model endpoint.
MODEL_AGENTS = ("terminus-2", "mini-swe-agent")
#: Native agents that call no model: their rows have no model.
MODELLESS_AGENTS = ("oracle", "nop")
#: Harbor's own environment types (docker, daytona, modal, e2b, skypilot, ...).
HARBOR_ENVIRONMENT_TYPES = frozenset(e.value for e in EnvironmentType)
#: Osmosis's default model for model-backed agents.
DEFAULT_MODEL_NAME = "openai/osmosis-rollout"
#: Pre-v0.3 HarborBackend keywords and what replaces them (the seed's migration table).
LEGACY_KEYWORDS = {
    "task_dir": "use tasks_dir= with task_mode= ('template' for one reusable task, 'dataset' for a folder of tasks)",
    "user_code_dir": "use code_dir= (a package project with pyproject.toml) or bundle= (a prebuilt wheel)",
    "workflow": "use agent= (an AgentWorkflow 'module:Class' or a native Harbor agent name)",
    "custom_tests_dir": "removed: put the tests in each task's tests/ folder, or pass an Osmosis grader=",
    "prebuild_local_image": "removed: Harbor caches images; run the prewarm flow before serving",
    "symlink_environment": "removed: every row gets its own copy of the task",
}


class ConfigurationError(ValueError):
    """The sweep cannot start; the message names the field and what to do."""


def describe(error: ValidationError) -> str:
    """A validation error as one line per problem, without pydantic's boilerplate: our own
    messages name their field already; pydantic's own (a bound, a type) get it in front."""

    def one(problem: Any) -> str:
        message = str(problem["msg"])
        if message.startswith("Value error, "):
            return message.removeprefix("Value error, ")
        where = ".".join(str(part) for part in problem["loc"])
        return f"{where}: {message}" if where else message

    return "; ".join(one(problem) for problem in error.errors())


def reject_legacy_keywords(data: Any) -> None:
    if isinstance(data, dict):
        for keyword, replacement in LEGACY_KEYWORDS.items():
            if keyword in data:
                raise ConfigurationError(f"{keyword}: a pre-v0.3 HarborBackend keyword; {replacement}.")


class TrialEnvironment(BaseModel):
    """Where trials run: the local container sandbox (podman), or any Harbor environment."""

    model_config = ConfigDict(title="Trial environment")

    type: str | None = Field(title="Environment Type", default=None, description="A Harbor environment type (docker, daytona, modal, e2b, ...).")
    import_path: str | None = Field(
        title="Environment Import Path",
        default=SANDBOX_IMPORT_PATH, description="A 'module:Class' Harbor environment; the local container sandbox by default."
    )
    kwargs: dict[str, Any] = Field(title="Environment Options", default_factory=dict, description="Options passed to the environment's constructor.")

    @model_validator(mode="after")
    def _one_kind(self) -> TrialEnvironment:
        if self.type and self.import_path == SANDBOX_IMPORT_PATH:
            self.import_path = None  # choosing a type replaces the default sandbox
        if bool(self.type) == bool(self.import_path):
            raise ConfigurationError("environment: set exactly one of `type` or `import_path`.")
        if self.type and self.type not in HARBOR_ENVIRONMENT_TYPES:
            raise ConfigurationError(f"environment.type: {self.type!r} is not a Harbor environment type; use one of {sorted(HARBOR_ENVIRONMENT_TYPES)}.")
        if self.import_path and ":" not in self.import_path:
            raise ConfigurationError(f"environment.import_path: {self.import_path!r} is not 'module:Class'.")
        return self

    @property
    def is_local_sandbox(self) -> bool:
        """Whether trials run in this project's container sandbox (host paths can be mounted in)."""
        return self.import_path == SANDBOX_IMPORT_PATH


class TaskSourcePolicy(BaseModel):
    """Which per-row task sources (a row's metadata.harbor_task) a sweep honours.

    Dataset rows are data, not code; a task brings an executable Dockerfile and verifier.
    By default only local paths under tasks_dir are allowed.
    """

    model_config = ConfigDict(title="Task sources")

    allowed_local_roots: list[str] = Field(title="Allowed Local Folders", default_factory=list, description="Extra local folders whose tasks rows may name "
        "(tasks_dir is always allowed).")
    allowed_git_url_prefixes: list[str] = Field(title="Allowed Git URL Prefixes", default_factory=list, description="Git URLs rows may fetch tasks from, by prefix (e.g. 'https://github.com/acme/').")
    allowed_registry_orgs: list[str] = Field(title="Allowed Registry Organisations", default_factory=list, description="Harbor registry organisations rows may name "
        "as 'org/name@ref'.")


def default_trials_dir() -> str:
    return str(Path(tempfile.gettempdir()) / "prefect-harbor" / "trials")


def own_verifier(task_dir: Path) -> str | None:
    """The task's own reward source, as Harbor finds it: ``tests/test.sh``, or a multi-step
    task's ``steps/<name>/tests/test.sh`` (Harbor 0.25 runs the steps and combines their
    rewards by the task's ``multi_step_reward_strategy``), or a separate verifier's own image,
    which brings its tests (``tests/Dockerfile``, or ``[verifier.environment] docker_image``);
    None when it has none of these. A separate verifier is named with it."""
    separate = separate_verifiers(task_dir)
    where = f", separate verifier: {'; '.join(_described(d, task_dir) for d in separate)}" if separate else ""
    if (task_dir / "tests" / "test.sh").is_file():
        return f"tests/test.sh{where}"
    steps = sorted(task_dir.glob("steps/*/tests/test.sh"))
    if steps:
        return f"steps/*/tests/test.sh ({len(steps)} steps){where}"
    return f"the verifier image's own /tests/test.sh{where}" if any(d.bundled_tests for d in separate) else None


def separate_verifiers(task_dir: Path) -> list[VerifierEnvironmentDefinition]:
    """The environments the task's separate verifiers run in, as Harbor resolves them (empty when
    every verifier is shared, or when task.toml cannot be read: the task's validation says why)."""
    try:
        return verifier_environments(task_dir, TaskConfig.model_validate_toml((task_dir / "task.toml").read_text()))
    except (OSError, ValueError):
        return []


def _described(definition: VerifierEnvironmentDefinition, task_dir: Path) -> str:
    if not definition.bundled_tests:
        return "a fresh copy of the task's environment"
    if definition.config.docker_image:
        return f"image {definition.config.docker_image}"
    return f"built from {definition.directory.relative_to(task_dir.resolve())}/"
