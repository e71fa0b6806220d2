"""The ``prefect-harbor`` command line.

``sweep`` validates the configuration and the dataset first (a bad one exits non-zero
with a one-line reason before any trial starts), then runs the ``evaluation-sweep``
flow: against the server in ``PREFECT_API_URL`` when set, else on a temporary local
Prefect server.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from prefect_harbor.config import SweepConfig, TaskMode
from prefect_harbor.results import SweepSummary
from prefect_harbor.rows import DatasetError, scan_dataset

app = typer.Typer(help="Agent evaluation sweeps as Prefect workflows on Harbor trials.", no_args_is_help=True)
err = Console(stderr=True)


@app.callback()
def main() -> None:
    """Agent evaluation sweeps as Prefect workflows on Harbor trials."""


def fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def config_error_line(error: ValidationError) -> str:
    """One line per problem, without pydantic's boilerplate."""
    return "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())


@app.command()
def sweep(
    tasks_dir: Annotated[Path, typer.Option(help="A task directory (template) or a folder of tasks (dataset).")],
    dataset: Annotated[str, typer.Option(help="JSONL or Parquet rows: a path or an fsspec URL.")],
    mode: Annotated[TaskMode, typer.Option(help="template: the prompt becomes instruction.md; dataset: metadata.harbor_task_id picks the task.")] = "dataset",
    agent: Annotated[str, typer.Option(help="Native agent (oracle, terminus-2, mini-swe-agent) or module:Class.")] = "oracle",
    results: Annotated[str, typer.Option(help="Results root: a local path or an fsspec URL.")] = "results",
    concurrency: Annotated[int, typer.Option(min=1, help="Trials running at once.")] = 4,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (with results_uri) on stdout.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Also show harbor's own trial logs on the console.")] = False,
) -> None:
    """Run every dataset row as a Harbor trial and write the results as Parquet."""
    try:
        config = SweepConfig(tasks_dir=tasks_dir, task_mode=mode, agent=agent, results=results, concurrency=concurrency)
    except ValidationError as error:
        raise fail(config_error_line(error)) from None
    try:
        info = scan_dataset(dataset)
    except DatasetError as error:
        raise fail(str(error)) from None
    if info.rows == 0:
        raise fail(f"dataset {dataset} has no rows")

    # Offline-friendly Prefect defaults (a cold temporary server can take over 20 s here).
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if not verbose:
        # Each trial's full harbor log is in its trial.log; keep the console to row outcomes.
        logging.getLogger("harbor.utils.logger").propagate = False
    from prefect_harbor.flows import evaluation_sweep  # imports prefect: only once the input is known good

    summary = asyncio.run(evaluation_sweep(dataset=dataset, config=config))
    if as_json:
        typer.echo(summary.model_dump_json())
    else:
        print_summary(summary)


def print_summary(summary: SweepSummary) -> None:
    console = Console()
    table = Table(title=f"Sweep {summary.run_id}", title_justify="left")
    table.add_column("task")
    table.add_column("rows", justify="right")
    table.add_column("mean reward", justify="right")
    for task, score in summary.per_task.items():
        table.add_row(task, str(score.rows), "-" if score.mean_reward is None else f"{score.mean_reward:.3f}")
    console.print(table)
    mean = "-" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    console.print(
        f"{summary.rows} rows: [green]{summary.success} success[/], [red]{summary.failure} failure[/], "
        f"{summary.cancelled} cancelled; mean reward {mean}"
    )
    console.print(f"Results: {summary.results_uri}", soft_wrap=True)
