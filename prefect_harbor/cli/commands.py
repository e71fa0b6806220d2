"""The ``prefect-harbor`` command line.

``sweep`` validates the configuration and the dataset first (a bad one exits 2 with a
one-line reason before any trial starts), then runs the ``evaluation-sweep`` flow:
against the server in ``PREFECT_API_URL`` when set, else on a temporary local server.
``check`` is the preflight: configuration, the tasks a sweep would run and their reward
source, and the removed Osmosis v0.2 APIs in a rollout project.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import logging
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_harbor.agents.bundles import check_project
from prefect_harbor.cli.compare import compare
from prefect_harbor.cli.console import VisibleConsole
from prefect_harbor.cli.plan import plan
from prefect_harbor.config import VERBOSE_VARIABLE, ConfigurationError, TaskMode, describe
from prefect_harbor.rows.attempts import RERUN_ALONE
from prefect_harbor.rows.dataset import DatasetError, iter_rows, scan_dataset
from prefect_harbor.stats.render import tokens_text
from prefect_harbor.storage.results import SweepSummary
from prefect_harbor.text import visible_logs

#: Prefect's temporary server may take this long to answer before a command gives up (Prefect's own
#: default, 20 s, is too short on a loaded machine: the server alone takes 5-6 s to start on an idle one).
EPHEMERAL_STARTUP_TIMEOUT_SEC = "120"
#: What a command says, in one line, when Prefect's temporary server still does not answer in time.
SERVER_TIMEOUT_HINT = (
    "Prefect's temporary API server did not start within {timeout} s (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS; "
    "the machine may be busy). Start a server once (`prefect server start`) and export "
    "PREFECT_API_URL=http://127.0.0.1:4200/api, or raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS."
)


def _prefect_defaults() -> None:
    """Offline-friendly Prefect defaults, unless the user set them: effective only before prefect is imported."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_STARTUP_TIMEOUT_SEC)


class _App(typer.Typer):
    """The command line, saying in one line what to do when Prefect's temporary server does not start in time."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except RuntimeError as error:
            if not str(error).startswith("Timed out while attempting to connect to ephemeral Prefect API server"):
                raise
            timeout = os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", EPHEMERAL_STARTUP_TIMEOUT_SEC)
            err.print(f"[bold red]error:[/] {SERVER_TIMEOUT_HINT.format(timeout=timeout)}", highlight=False, soft_wrap=True)
            raise SystemExit(2) from None


app = _App(help="Agent evaluation sweeps as Prefect workflows on Harbor trials.", no_args_is_help=True)
err = VisibleConsole(stderr=True)

# Options shared by `sweep` and `check` (one definition, one help text).
TasksDir = Annotated[Path | None, typer.Option(help="A task directory (template) or a folder of tasks (dataset).")]
Mode = Annotated[
    TaskMode | None,
    typer.Option(help="template: the prompt becomes instruction.md; dataset: metadata.harbor_task_id picks the task. Default: template for one task, dataset for a "
        "folder of tasks."),
]
Agent = Annotated[str, typer.Option(help="Native agent (oracle, terminus-2, mini-swe-agent, nop) or module:Class.")]
Grader = Annotated[str | None, typer.Option(help="An Osmosis Grader 'module:Class' for tasks without tests/test.sh.")]
BackendBlock = Annotated[str | None, typer.Option(help="Use a saved Harbor Backend block instead of the flags above.")]
CodeDir = Annotated[Path | None, typer.Option(help="The workflow's project (pyproject.toml + one package); inferred from --agent when omitted.")]
WorkflowConfig = Annotated[str | None, typer.Option(help="The workflow's config, 'module:attr' (re-imported in the sandbox).")]
GraderConfig = Annotated[str | None, typer.Option(help="The grader's config, 'module:attr' (re-imported in the sandbox).")]
BundleWheel = Annotated[Path | None, typer.Option("--bundle", help="A prebuilt bundle wheel, instead of building --code-dir.")]
Model = Annotated[str | None, typer.Option(help="Model for model-backed agents (a row's metadata.harbor_model overrides it).")]
EndpointBlock = Annotated[str | None, typer.Option(help="A saved Model Endpoint block for model-backed agents.")]
BaseUrl = Annotated[str | None, typer.Option(help="An OpenAI-compatible base URL, instead of --model-endpoint.")]
KeyEnv = Annotated[str | None, typer.Option(help="The environment variable holding the key for --model-base-url (never the key itself).")]
ForceBuild = Annotated[
    bool, typer.Option("--force-build", help="Build task images from their Dockerfiles even when task.toml names a prebuilt docker_image (as `harbor run --force-build`).")
]
TimeoutMultiplier = Annotated[
    float | None, typer.Option(min=0, help="Multiply every task timeout by this (as `harbor run --timeout-multiplier`); a phase's own flag wins.")
]
AgentTimeoutMultiplier = Annotated[float | None, typer.Option(min=0, help="Multiply the task's agent timeout by this instead.")]
VerifierTimeoutMultiplier = Annotated[float | None, typer.Option(min=0, help="Multiply the task's verifier timeout by this instead.")]
AgentSetupTimeoutMultiplier = Annotated[float | None, typer.Option(min=0, help="Multiply the agent setup timeout by this instead.")]
BuildTimeoutMultiplier = Annotated[float | None, typer.Option(min=0, help="Multiply the task's build_timeout_sec by this instead.")]


@app.callback()
def main() -> None:
    """Agent evaluation sweeps as Prefect workflows on Harbor trials."""
    _prefect_defaults()  # before anything imports prefect: its settings are read once, at import


def fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


@contextlib.contextmanager
def temporary_server() -> Iterator[None]:
    """Without ``PREFECT_API_URL``, a Prefect server for this command alone, out of the terminal's reach.

    Prefect's own temporary server would start in the CLI's process group, so a Ctrl-C in a
    terminal (sent to the whole foreground group) killed it at once, while the sweep was
    still cancelling its trials and recording its rows through it. This one is Prefect's
    same server, started in a session of its own; it still dies with the CLI (a parent-death
    signal), and stops when the command exits.
    """
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = SubprocessASGIServer()
    popen = subprocess.Popen
    subprocess.Popen = functools.partial(popen, start_new_session=True, preexec_fn=_die_with_parent)  # type: ignore[misc]
    try:
        server.start()
    finally:
        subprocess.Popen = popen  # type: ignore[misc]
    # Stopped by the atexit hook start() registers, which runs after Prefect's log and event
    # workers have flushed to it (stopping it here left them retrying a server that was gone).
    with temporary_settings({PREFECT_API_URL: server.api_url}):
        yield


def _die_with_parent() -> None:
    """In the child, before exec: be sent SIGTERM when the parent dies (Linux's PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def load_backend(backend_block: str | None, tasks_dir: Path | None, mode: TaskMode | None, agent: str, grader: str | None, **flags):
    """The backend from a saved block, or from the flags; exits 2 with the reason."""
    from prefect_harbor.blocks import HarborBackend

    endpoint_flags = {key: flags.pop(key, None) for key in ("model_endpoint", "model_base_url", "model_api_key_env")}
    flags = {key: value for key, value in flags.items() if value is not None}
    if backend_block is not None:
        given = [f"--{key.replace('_', '-')}" for key, value in {**flags, **endpoint_flags}.items() if value is not None]
        if given:
            raise fail(f"--backend-block: the saved block holds the whole configuration; drop {', '.join(given)} (or edit the block).")
        _prefect_defaults()
        from prefect_harbor.flows.configuration import resolve_backend

        try:
            return asyncio.run(resolve_backend(None, backend_block))
        except ConfigurationError as error:
            raise fail(str(error)) from None
    if tasks_dir is None:
        raise fail("give --tasks-dir (with --mode/--agent), or --backend-block NAME")
    if "model" in flags:
        flags["model_name"] = flags.pop("model")
    if "bundle" in flags and agent == "oracle":
        agent = None  # the bundle's workflow is the agent
    try:
        endpoint = endpoint_from_flags(**endpoint_flags)
        backend = HarborBackend(tasks_dir=tasks_dir, task_mode=mode, agent=agent, grader=grader, model_endpoint=endpoint, **flags)
        spec = backend.spec().bundle_spec()
        if spec is not None:
            check_project(spec)  # the rest (build, imports) is the flow's first step
        return backend
    except ValidationError as error:
        raise fail(describe(error)) from None
    except ConfigurationError as error:
        raise fail(str(error)) from None


def shard_option(value: str) -> int | str:
    """``--shards``: a host count (1: this host) or ``auto``, one shard per worker online."""
    if value == "auto":
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise typer.BadParameter(f"{value!r} is not a host count; give 1 (this host), more, or 'auto' (one per worker online).")


def endpoint_from_flags(model_endpoint: str | None, model_base_url: str | None, model_api_key_env: str | None):
    """The endpoint from a saved block, or from a URL plus the NAME of a variable holding the key."""
    from prefect_harbor.blocks import ModelEndpoint

    if model_endpoint is not None and (model_base_url or model_api_key_env):
        raise ConfigurationError("--model-endpoint: a saved block replaces --model-base-url/--model-api-key-env; give one or the other.")
    if model_api_key_env is not None and model_base_url is None:
        raise ConfigurationError("--model-api-key-env: names the key for --model-base-url; add --model-base-url URL.")
    if model_endpoint is not None:
        _prefect_defaults()
        from prefect_harbor.flows.configuration import load_block

        return asyncio.run(load_block(ModelEndpoint, model_endpoint, "model_endpoint"))
    if model_base_url is None:
        return None
    key = None
    if model_api_key_env is not None:
        key = os.environ.get(model_api_key_env)
        if not key:
            raise ConfigurationError(f"--model-api-key-env: the environment variable {model_api_key_env} is not set; export it first.")
    return ModelEndpoint(base_url=model_base_url, api_key=key)


@app.command()
def sweep(
    dataset: Annotated[str, typer.Option(help="JSONL or Parquet rows: a path or an fsspec URL.")],
    tasks_dir: TasksDir = None,
    mode: Mode = None,
    agent: Agent = "oracle",
    grader: Grader = None,
    code_dir: CodeDir = None,
    workflow_config: WorkflowConfig = None,
    grader_config: GraderConfig = None,
    bundle: BundleWheel = None,
    model: Model = None,
    model_endpoint: EndpointBlock = None,
    model_base_url: BaseUrl = None,
    model_api_key_env: KeyEnv = None,
    backend_block: BackendBlock = None,
    force_build: ForceBuild = False,
    timeout_multiplier: TimeoutMultiplier = None,
    agent_timeout_multiplier: AgentTimeoutMultiplier = None,
    verifier_timeout_multiplier: VerifierTimeoutMultiplier = None,
    agent_setup_timeout_multiplier: AgentSetupTimeoutMultiplier = None,
    environment_build_timeout_multiplier: BuildTimeoutMultiplier = None,
    certified_only: Annotated[
        bool, typer.Option("--certified-only", help="Run only tasks certified for their current content (prefect-harbor certify); other tasks' rows are not scored.")
    ] = False,
    results: Annotated[str, typer.Option(help="Results root: a local path or an fsspec URL.")] = "results",
    storage_block: Annotated[str | None, typer.Option(help="Write results to a saved Results Storage block instead of --results.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Trials running at once (default: the backend's n_concurrent, 4).")] = None,
    resume: Annotated[str | None, typer.Option(help="Continue this crashed or cancelled run's folder (same dataset and backend).")] = None,
    rerun_failed: Annotated[
        str | None, typer.Option(help="A new run of only this earlier run's attempts that were not scored or were cancelled (never its scored ones).")
    ] = None,
    rerun_agent_failures: Annotated[bool, typer.Option(help="With --rerun-failed, also run its agent failures (errors, timeouts) again.")] = False,
    prewarm: Annotated[bool, typer.Option(help="First set up each selected task once (install-only); its rows fail at once if that fails.")] = True,
    rows_per_task_run: Annotated[
        int | None, typer.Option(min=1, help="Rows one Prefect task run may hold (default: 1 for small sweeps, batches for big ones).")
    ] = None,
    attempts: Annotated[
        int | None, typer.Option(min=1, help="Independent trials per row, each its own result row and archive (default: the backend's attempts, 1); pass@k for k up to this.")
    ] = None,
    stop_at_ci_width: Annotated[
        float | None,
        typer.Option(
            min=0, metavar="WIDTH",
            help="Run the attempts in rounds (every row's attempt 1, then 2, ...) and stop once the mean's 95% interval is this narrow; "
            "--attempts is then the most a row may get (default: the backend's).",
        ),
    ] = None,
    shards: Annotated[
        str,
        typer.Option(
            callback=shard_option,
            metavar="N|auto",
            help="Spread the rows over this many hosts, or 'auto' (one per worker online): sweep-shard deployment runs on its pool "
            "(a real server, --storage-block, --backend-block).",
        ),
    ] = "1",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (with results_uri) on stdout.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Also show harbor's own trial logs on the console.")] = False,
) -> None:
    """Run every dataset row as a Harbor trial and write the results as Parquet."""
    backend = load_backend(
        backend_block, tasks_dir, mode, agent, grader, code_dir=code_dir, workflow_config=workflow_config, grader_config=grader_config,
        bundle=bundle, model=model, model_endpoint=model_endpoint, model_base_url=model_base_url, model_api_key_env=model_api_key_env,
        force_build=force_build or None, certified_tasks_only=certified_only or None, timeout_multiplier=timeout_multiplier,
        agent_timeout_multiplier=agent_timeout_multiplier, verifier_timeout_multiplier=verifier_timeout_multiplier,
        agent_setup_timeout_multiplier=agent_setup_timeout_multiplier, environment_build_timeout_multiplier=environment_build_timeout_multiplier,
    )  # fmt: skip
    if rerun_agent_failures and not rerun_failed:
        raise fail(RERUN_ALONE)
    try:
        info = scan_dataset(dataset)
    except DatasetError as error:
        raise fail(str(error)) from None
    if info.rows == 0:
        raise fail(f"dataset {dataset} has no rows")

    _prefect_defaults()
    if verbose:  # each trial's full harbor log is always in its trial.log; the flow keeps the console to row outcomes
        os.environ[VERBOSE_VARIABLE] = "1"
    from prefect_harbor.flows import evaluation_sweep  # imports prefect: only once the input is known good

    with temporary_server():
        state = asyncio.run(
            evaluation_sweep(
                dataset=dataset, backend=backend, results=results, storage_block=storage_block, concurrency=concurrency,
                resume=resume, rerun_failed=rerun_failed, rerun_agent_failures=rerun_agent_failures, prewarm=prewarm,
                rows_per_task_run=rows_per_task_run, attempts=attempts, stop_at_ci_width=stop_at_ci_width, shards=shards, return_state=True,
            )  # fmt: skip
        )
    summary = state.result(raise_on_failure=False)
    if isinstance(summary, ConfigurationError):  # found once the flow could check it: storage, blocks
        raise fail(str(summary))
    if isinstance(summary, BaseException):
        raise summary
    if as_json:
        typer.echo(summary.model_dump_json())
    else:
        print_summary(summary)
    if state.is_cancelled():
        err.print(f"[yellow]cancelled:[/] {state.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=130)


@app.command()
def certify(
    tasks_dir: Annotated[Path, typer.Option(help="A folder of Harbor tasks (each a folder with a task.toml).")],
    task: Annotated[list[str] | None, typer.Option(help="Only this task (a folder name under --tasks-dir); repeat for more.")] = None,
    runs: Annotated[int, typer.Option(min=1, help="Attempts per task for each agent (the oracle, then nop).")] = 3,
    results: Annotated[str, typer.Option(help="Results root (a local path or an fsspec URL): where certifications are kept, and sweeps look.")] = "results",
    storage_block: Annotated[str | None, typer.Option(help="Keep them in a saved Results Storage block instead of --results.")] = None,
    concurrency: Annotated[int | None, typer.Option(min=1, help="Trials running at once (default 4).")] = None,
    reward_key: Annotated[str, typer.Option(help="The verifier's key that is the reward, for tasks that write no 'reward' key.")] = "reward",
    as_json: Annotated[bool, typer.Option("--json", help="Print the certifications as one JSON list on stdout.")] = False,
) -> None:
    """Certify tasks before a sweep uses them: the oracle always rewarded, an agent doing nothing never.

    Each task's certification is kept by its content digest; `sweep --certified-only` runs only certified tasks."""
    _prefect_defaults()
    from prefect_harbor.flows import certify_tasks

    with temporary_server():
        state = asyncio.run(
            certify_tasks(
                tasks_dir=str(tasks_dir), runs=runs, tasks=task or None, results=results, storage_block=storage_block, concurrency=concurrency,
                reward_key=reward_key, return_state=True,
            )  # fmt: skip
        )
    certifications = state.result(raise_on_failure=False)
    if isinstance(certifications, ConfigurationError):
        raise fail(str(certifications))
    if isinstance(certifications, BaseException):
        err.print(f"[bold red]error:[/] {escape(str(certifications))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=130 if state.is_cancelled() else 1)
    if as_json:
        typer.echo(json.dumps([c.model_dump(mode="json") for c in certifications]))
        return
    print_certifications(certifications)


def print_certifications(certifications) -> None:
    from prefect_harbor.certification import table_rows

    console = VisibleConsole()
    rows = [{k: v for k, v in row.items() if k != "digest"} for row in table_rows(certifications)]  # the digest is in --json and the files
    table = Table(title="Certification", title_justify="left")
    for column in rows[0]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(str(value)) for value in row.values()))
    console.print(table)
    for certification in certifications:
        if certification.verdict != "certified":
            console.print(f"[yellow]{certification.verdict}[/] {escape(certification.task)}: {escape(certification.reason)}", highlight=False, soft_wrap=True)
    certified = sum(c.verdict == "certified" for c in certifications)
    console.print(f"{certified} of {len(certifications)} task(s) certified", highlight=False)


@app.command()
def check(
    tasks_dir: TasksDir = None,
    mode: Mode = None,
    agent: Agent = "oracle",
    grader: Grader = None,
    backend_block: BackendBlock = None,
    force_build: ForceBuild = False,
    dataset: Annotated[str | None, typer.Option(help="Check the tasks this dataset's rows select (default: every task of --tasks-dir).")] = None,
    code_dir: Annotated[Path | None, typer.Option(help="A rollout project to scan for removed Osmosis v0.2 APIs (alone, or with a configuration).")] = None,
) -> None:
    """Preflight: validate the configuration, check each task as the sweep would, scan for v0.2 APIs."""
    from prefect_harbor.cli.migration import scan_for_removed_apis

    console = VisibleConsole()
    problems = 0
    scanned = code_dir
    if tasks_dir is not None or backend_block is not None:
        backend = load_backend(backend_block, tasks_dir, mode, agent, grader, code_dir=code_dir if ":" in agent else None, force_build=force_build or None)
        console.print(f"[green]configuration OK[/]: {backend.task_mode} mode, tasks_dir {backend.tasks_dir}, agent {backend.agent_spec}", soft_wrap=True)
        problems += check_tasks_of(backend.spec(), dataset, console)
        scanned = code_dir or backend.code_dir
    elif code_dir is None:
        raise fail("give --tasks-dir (with --mode/--agent) or --backend-block NAME to check a configuration, and/or --code-dir DIR to scan a rollout project")
    if scanned is not None:
        if not Path(scanned).is_dir():
            raise fail(f"--code-dir: {scanned} is not a directory; give the rollout project's folder")
        hits = scan_for_removed_apis(Path(scanned))
        for hit in hits:
            console.print(str(hit), highlight=False, soft_wrap=True)
        console.print(f"{len(hits)} use(s) of removed v0.2 APIs under {scanned}", soft_wrap=True)
        problems += len(hits)
    raise typer.Exit(code=1 if problems else 0)


def check_tasks_of(backend, dataset: str | None, console: Console) -> int:
    """Print each task's check (a table, then one line per problem or note); return the problems."""
    from prefect_harbor.cli.preflight import check_tasks, task_rows

    try:
        groups = task_rows(backend, None if dataset is None else iter_rows(dataset))
    except DatasetError as error:
        raise fail(str(error)) from None
    with visible_logs():  # warnings about a task quote its files
        reports = asyncio.run(check_tasks(backend, groups, counted=dataset is not None))
    table = Table("task", "rows", "reward source", "check", title="Tasks", title_justify="left")
    for report in reports:
        verdict = "[red]refused[/]" if report.problem else "[yellow]note[/]" if report.note else "[green]ok[/]"
        table.add_row(escape(report.task), "-" if report.rows is None else str(report.rows), report.reward_source or "-", verdict)
    console.print(table)
    for report in reports:
        if report.image:
            console.print(f"image {escape(report.task)}: {escape(report.image)}", highlight=False, soft_wrap=True)
        if report.problem:
            console.print(f"[red]refused[/] {escape(report.task)}: {escape(report.problem)}", highlight=False, soft_wrap=True)
        elif report.note:
            console.print(f"[yellow]note[/] {escape(report.task)}: {escape(report.note)}", highlight=False, soft_wrap=True)
    return sum(report.problem is not None for report in reports)


def print_summary(summary: SweepSummary) -> None:
    from prefect_harbor.cli.compare import print_comparison, statistics_table

    console = VisibleConsole()
    if summary.statistics is not None:
        console.print(statistics_table(summary.statistics, f"Sweep {summary.run_id}"))
    else:
        table = Table(title=f"Sweep {summary.run_id}", title_justify="left")
        table.add_column("task")
        table.add_column("rows", justify="right")
        table.add_column("mean reward", justify="right")
        for task, score in summary.per_task.items():
            table.add_row(task, str(score.rows), "-" if score.mean_reward is None else f"{score.mean_reward:.3f}")
        console.print(table)
    rows = f"{summary.rows} rows" if summary.attempts == 1 else f"{summary.trials} trials"
    mean = summary.mean_phrase()
    console.print(
        f"{rows}: [green]{summary.success} success[/], [red]{summary.failure} failure[/], "
        f"{summary.cancelled} cancelled; {mean}", highlight=False, soft_wrap=True,
    )  # fmt: skip
    if summary.stopped_early:
        console.print(f"Stopping rule: {summary.stopped_early}", highlight=False, soft_wrap=True)
    if summary.statistics is not None and tokens_text(summary.statistics.tokens) != "-":
        console.print(f"Usage: {tokens_text(summary.statistics.tokens)}", highlight=False, soft_wrap=True)
    if summary.statistics is not None and summary.statistics.verifier_flagged:
        console.print(f"[yellow]{summary.statistics.verifier_flagged} attempt(s) had their verifier output flagged as tampered with[/]")
    if summary.comparison is not None:
        print_comparison(summary.comparison, console, rows_listed=10)
    console.print(f"Results: {summary.results_uri}", soft_wrap=True)


images = typer.Typer(help="Task images and the local base images they build on.", no_args_is_help=True)
app.add_typer(images, name="images")


@images.command("bootstrap")
def images_bootstrap(
    references: Annotated[list[str], typer.Argument(help="Base images to make, e.g. debian:bookworm debian:bookworm-slim.")],
    mirror: Annotated[str | None, typer.Option(help="The Debian mirror (default: the host's own, from its apt sources).")] = None,
    force: Annotated[bool, typer.Option(help="Bootstrap again even if the image exists.")] = False,
) -> None:
    """Build base images from Debian's mirror, for hosts that reach no container registry."""
    from prefect_harbor.sandbox.bootstrap import bootstrap

    for reference in references:
        try:
            made = bootstrap(reference, mirror, force=force)
        except (ValueError, RuntimeError) as error:
            raise fail(str(error)) from None
        VisibleConsole().print(f"{reference}: {made}", highlight=False)


@images.command("builder")
def images_builder(
    mirror: Annotated[str | None, typer.Option(help="The Debian mirror (default: the host's own, from its apt sources).")] = None,
    force: Annotated[bool, typer.Option(help="Bootstrap it again even if it exists.")] = False,
) -> None:
    """Make the image builder: Debian 13's buildah, in which every task image is built (see the README's isolation section)."""
    from prefect_harbor.sandbox.builder import ensure_builder_image

    try:
        made = ensure_builder_image(mirror, force=force)
    except RuntimeError as error:
        raise fail(str(error)) from None
    VisibleConsole().print(f"builder: {made}", highlight=False)


@images.command("prune")
def images_prune(
    unused_days: Annotated[float, typer.Option(min=0, help="Remove task images no sweep has used for this many days.")] = 14,
    stand_in_unused_days: Annotated[
        float, typer.Option(min=0, help="Remove the stand-ins shipped for unpullable bases (slow to make again) after this many unused days.")
    ] = 14,
) -> None:
    """Free disk: task images no sweep used lately, and the builder's cache when over its cap (PREFECT_HARBOR_BUILDER_CACHE_GB)."""
    from prefect_harbor.sandbox.builder import builder_home
    from prefect_harbor.sandbox.image_disk import cache_cap_bytes, check_cache, prune_task_images
    from prefect_harbor.sandbox.images import IMAGE_REPOSITORY

    home = builder_home()
    try:
        cap = cache_cap_bytes()  # a bad setting fails before anything is removed
        pruned = prune_task_images(home, IMAGE_REPOSITORY, unused_days, stand_in_unused_days=stand_in_unused_days)
        checked = check_cache(home, cap)
    except (ValueError, RuntimeError) as error:
        raise fail(str(error)) from None
    VisibleConsole().print(pruned.describe(unused_days), highlight=False)
    VisibleConsole().print(checked.describe(), highlight=False)


@app.command()
def cleanup(
    results: Annotated[str, typer.Option(help="Results root whose dead runs to mark Crashed: a local path or an fsspec URL.")] = "results",
    storage_block: Annotated[str | None, typer.Option(help="The results root of a saved Results Storage block instead.")] = None,
) -> None:
    """Remove trial containers left behind by sweeps whose process died, and mark such runs Crashed."""
    from prefect_harbor.sandbox.janitor import reap_orphans
    from prefect_harbor.storage.control import find_stale_runs

    reaped = reap_orphans()
    for name in reaped:
        VisibleConsole().print(f"removed {name}", highlight=False)
    VisibleConsole().print(f"{len(reaped)} orphaned container(s) removed")
    options = None
    if storage_block is not None:
        storage = load_storage(storage_block)
        results, options = storage.url, storage.storage_options()
    stale = find_stale_runs(results, options)
    if stale:
        _prefect_defaults()
        from prefect_harbor.flows.cancellation import mark_crashed

        logging.basicConfig(format="%(message)s", level=logging.INFO)
        with temporary_server():
            asyncio.run(mark_crashed(stale, logging.getLogger("prefect_harbor.cleanup")))
    VisibleConsole().print(f"{len(stale)} run(s) under {results} marked Crashed", highlight=False, soft_wrap=True)


@app.command()
def serve(
    max_concurrent_sweeps: Annotated[int, typer.Option(min=1, help="Sweeps running at once; further runs queue.")] = 1,
    nightly_dataset: Annotated[str | None, typer.Option(help="Also serve a scheduled sweep of this dataset...")] = None,
    nightly_backend_block: Annotated[str | None, typer.Option(help="...with this saved Harbor Backend block.")] = None,
    nightly_results: Annotated[str, typer.Option(help="Results root for the scheduled sweep.")] = "results",
    cron: Annotated[str, typer.Option(help="The scheduled sweep's cron schedule.")] = "0 2 * * *",
    interval: Annotated[float | None, typer.Option(help="Seconds between scheduled sweeps, instead of --cron (for trying it out).")] = None,
) -> None:
    """Serve the evaluation-sweep deployments from this process (needs PREFECT_API_URL)."""
    _prefect_defaults()
    from prefect_harbor.deployments.serve import serve_sweeps

    serve_sweeps(
        max_concurrent_sweeps=max_concurrent_sweeps, nightly_dataset=nightly_dataset, nightly_backend_block=nightly_backend_block,
        nightly_results=nightly_results, cron=cron, interval_seconds=interval,
    )  # fmt: skip


RunFolder = Annotated[str, typer.Argument(help="The run's folder: <results root>/<run_id> (a path or an fsspec URL).")]
StorageBlock = Annotated[str | None, typer.Option(help="Credentials for the run folder from a saved Results Storage block.")]


def load_storage(storage_block: str):
    _prefect_defaults()
    from prefect_harbor.blocks import ResultsStorage

    return ResultsStorage.load(storage_block)


def open_run(run: str, storage_block: str | None):
    from prefect_harbor.storage.run_store import RunStore

    return RunStore.open(run, load_storage(storage_block).storage_options() if storage_block else None)


def resume_hint(run: str) -> str:
    return f"continue it with `prefect-harbor sweep <its options> --resume {run}`"


@app.command()
def status(
    run: RunFolder,
    ids: Annotated[list[str] | None, typer.Argument(help="Row ids to report (default: the counts and every row).")] = None,
    storage_block: StorageBlock = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Each row's status: queued, running, grading, success, failure, cancelled, or unknown."""
    import json

    from prefect_harbor.storage.control import STATUS_FILE, NotStarted, read_status

    try:
        report = read_status(open_run(run, storage_block), ids)
    except NotStarted:
        raise fail(f"{run} has no {STATUS_FILE} yet: is it a sweep run folder, and has the sweep started?") from None
    state, rows, attempts, problems = report.state, report.rows, report.attempts, report.problems
    if as_json:
        found = {"state": state, "counts": report.counts, "rows": rows, "hosts": report.hosts, "stale": report.stale, "problems": problems}
        typer.echo(json.dumps(found | ({"attempts": attempts} if attempts is not None else {})))
        return
    console = VisibleConsole()
    counted = " (attempts)" if attempts is not None else ""
    console.print(f"run {run}: {state}; " + ", ".join(f"{n} {s}" for s, n in sorted(report.counts.items())) + counted, highlight=False, soft_wrap=True)
    if report.stale:
        console.print(f"[yellow]stale:[/] {report.stale}: nothing runs it any more; {resume_hint(run)}", highlight=False, soft_wrap=True)
    for problem in problems:
        console.print(f"[yellow]damaged:[/] {problem}", highlight=False, soft_wrap=True)
    several_hosts = len(set(report.hosts.values())) > 1  # one host is every row's: no column
    table = Table("row", "status", *(["attempts"] if attempts is not None else []), *(["host"] if several_hosts else []))
    for row_id, row_status in rows.items():
        each = [", ".join(f"#{n} {s}" for n, s in sorted(attempts[row_id].items(), key=lambda item: int(item[0])))] if attempts is not None else []
        table.add_row(row_id, row_status, *each, *([report.hosts.get(row_id, "")] if several_hosts else []))
    console.print(table)


@app.command()
def cancel(
    run: RunFolder,
    ids: Annotated[list[str] | None, typer.Argument(help="Row ids to cancel.")] = None,
    prefix: Annotated[list[str] | None, typer.Option(help="Cancel every row whose id starts with this (repeatable).")] = None,
    all_rows: Annotated[bool, typer.Option("--all", help="Cancel every row (the whole sweep).")] = False,
    storage_block: StorageBlock = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the sweep's answer.")] = 30,
    as_json: Annotated[bool, typer.Option("--json", help="Print the dispositions as JSON on stdout.")] = False,
) -> None:
    """Cancel rows of a running sweep; prints cancelled_queued, cancelled_running or not_found per row."""
    import json

    from prefect_harbor.storage.control import CancelRequest, NotCancellable, send_cancel

    if not ids and not prefix and not all_rows:
        raise fail("name rows to cancel: ids, --prefix P, or --all")
    try:
        dispositions = send_cancel(open_run(run, storage_block), CancelRequest(ids=ids or [], prefixes=prefix or [], all=all_rows), timeout)
    except NotCancellable as refused:
        if refused.stale:
            raise fail(f"{run} is stale ({refused.stale}): nothing runs it, so there is nothing to cancel; {resume_hint(run)}") from None
        raise fail(f"{run} has ended ({refused.ended}): there is nothing to cancel") from None
    except TimeoutError:
        raise fail(f"no answer from the sweep within {timeout:g} s: is {run} still running?") from None
    if as_json:
        typer.echo(json.dumps(dispositions))
        return
    table = Table("row", "disposition")
    for row_id, disposition in dispositions.items():
        table.add_row(row_id, disposition)
    VisibleConsole().print(table)


app.command("compare")(compare)
app.command("plan")(plan)
