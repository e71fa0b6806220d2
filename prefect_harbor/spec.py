"""The backend configuration the core runs on: frozen, nested, and free of Prefect.

The Harbor Backend block (``blocks/backend.py``) is the UI's form: flat fields, each checked
as the user typed it, with messages that name the field. A flow resolves the block once
(``HarborBackend.spec()``) and hands this down to the trial, prewarm, source and storage code,
so none of it imports a Block. Fields that exclude one another in the form are a union here:
an agent is native or a workflow, never both. Shaped after Harbor's own ``TrialConfig``
(``harbor.models.trial.config``): the agent, the environment and the verifier as parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from prefect_harbor.agents.bundles import BundleSpec, project_dir_for
from prefect_harbor.config import DEFAULT_MODEL_NAME, NativeAgentName, TaskMode
from prefect_harbor.sandbox import IMPORT_PATH as SANDBOX_IMPORT_PATH
from prefect_harbor.storage.archive import ArchiveLimits
from prefect_harbor.trial import reward_key
from prefect_harbor.trial.tampering import OnTampering


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Endpoint(_Part):
    """An OpenAI-compatible model endpoint (the Model Endpoint block's values); its key stays a secret."""

    base_url: str
    api_key: SecretStr | None = None
    model: str | None = None


class NativeAgent(_Part):
    """A native Harbor agent run by name, with its own options."""

    kind: Literal["native"] = "native"
    name: NativeAgentName
    options: dict[str, Any] = Field(default_factory=dict)


class WorkflowAgent(_Part):
    """An Osmosis AgentWorkflow run by the harness from the bundle (``workflow`` None: the prebuilt wheel's own)."""

    kind: Literal["workflow"] = "workflow"
    workflow: str | None = None
    config: str | None = None


Agent = Annotated[NativeAgent | WorkflowAgent, Field(discriminator="kind")]


class Model(_Part):
    """The model that model-backed agents and workflows call, and where."""

    name: str = DEFAULT_MODEL_NAME
    endpoint: Endpoint | None = None


class Sources(_Part):
    """Where rows' tasks come from: ``tasks_dir`` in its mode, and the per-row sources allowed."""

    tasks_dir: Path
    mode: TaskMode
    allowed_local_roots: tuple[str, ...] = ()
    allowed_git_url_prefixes: tuple[str, ...] = ()
    allowed_registry_orgs: tuple[str, ...] = ()


class Environment(_Part):
    """The Harbor environment trials run in, and what of the host a task may read."""

    type: str | None = None
    import_path: str | None = SANDBOX_IMPORT_PATH
    kwargs: dict[str, Any] = Field(default_factory=dict)
    force_build: bool = False
    task_env_passthrough: tuple[str, ...] = ()

    @property
    def is_local_sandbox(self) -> bool:
        """Whether trials run in this project's container sandbox (host paths can be mounted in)."""
        return self.import_path == SANDBOX_IMPORT_PATH

    @property
    def label(self) -> str | None:
        return self.type or self.import_path


class Scoring(_Part):
    """How a row is scored: the grader when a task has no tests, the reward read, the verifier's isolation."""

    grader: str | None = None
    grader_config: str | None = None
    reward_key: str = reward_key.DEFAULT
    reward_range: Literal["finite"] | list[float] = "finite"
    on_tampering: OnTampering = "flag"
    verifier_isolation: Literal["shared", "separate"] = "shared"
    verifier_artifacts: tuple[str, ...] = ()
    #: Rows of a task with no ``certified`` verdict for its current content are not scored.
    certified_tasks_only: bool = False


class TimeoutMultipliers(_Part):
    """Harbor's timeout multipliers (``harbor run --timeout-multiplier`` and one per phase): each
    phase's task timeout is multiplied by its own, else by ``overall``."""

    overall: float = 1.0
    agent: float | None = None
    verifier: float | None = None
    agent_setup: float | None = None
    environment_build: float | None = None

    def trial_config(self) -> dict[str, float | None]:
        """The fields of Harbor's ``TrialConfig`` of the same names."""
        phases = {f"{phase}_timeout_multiplier": getattr(self, phase) for phase in ("agent", "verifier", "agent_setup", "environment_build")}
        return {"timeout_multiplier": self.overall, **phases}

    @property
    def build(self) -> float:
        """What a task's ``build_timeout_sec`` is multiplied by (the prewarm's builds too)."""
        return self.environment_build if self.environment_build is not None else self.overall


class Limits(_Part):
    """How much runs at once and how much each row may take."""

    n_concurrent: int = 4
    attempts: int = 1
    #: Attempts run in rounds, stopping once the mean's 95% interval is this narrow (``stats/stopping.py``); None: all of them.
    stop_at_ci_width: float | None = None
    #: Further tries of an attempt not scored for a passing cause (``trial/retry.py``), and the first wait before one.
    not_scored_retries: int = 2
    retry_wait_sec: float = 5.0
    agent_setup_timeout_sec: float | None = None
    timeouts: TimeoutMultipliers = TimeoutMultipliers()
    archive: ArchiveLimits = ArchiveLimits()


class BundleSource(_Part):
    """The workflow bundle: a prebuilt ``wheel``, or a project to build (``code_dir``, else found from the workflow or grader)."""

    wheel: Path | None = None
    code_dir: Path | None = None
    #: ``patch_dockerfile_with_sdk``: the bundle's environment goes into the task image rather than being mounted.
    bake: bool = True


class BackendSpec(_Part):
    """Everything a sweep's core needs to run rows, resolved once from the Harbor Backend block."""

    sources: Sources
    agent: Agent
    model: Model = Model()
    environment: Environment = Environment()
    scoring: Scoring = Scoring()
    limits: Limits = Limits()
    #: None when no bundle is needed (a native agent without a grader).
    bundle: BundleSource | None = None
    trials_dir: str
    cleanup_successful_trials: bool = True

    @property
    def native(self) -> NativeAgent | None:
        return self.agent if isinstance(self.agent, NativeAgent) else None

    @property
    def agent_name(self) -> str | None:
        """What runs each row, as Osmosis's ``agent=`` names it: a native agent or a workflow's 'module:Class'."""
        return self.agent.name if isinstance(self.agent, NativeAgent) else self.agent.workflow

    def bundle_spec(self) -> BundleSpec | None:
        """What to build into the bundle (None with a prebuilt wheel or when none is needed)."""
        if self.bundle is None or self.bundle.wheel is not None:
            return None
        workflow = self.agent.workflow if isinstance(self.agent, WorkflowAgent) else None
        grader = self.scoring.grader
        anchor = workflow or grader
        assert anchor is not None
        code_dir = self.bundle.code_dir or project_dir_for(anchor, "agent" if workflow else "grader")
        return BundleSpec(
            code_dir=code_dir, workflow=workflow, grader=grader,
            workflow_config=self.agent.config if isinstance(self.agent, WorkflowAgent) and workflow else None,
            grader_config=self.scoring.grader_config if grader else None,
        )  # fmt: skip
