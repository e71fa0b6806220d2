"""``prefect-harbor plan``: how many rows and attempts the next sweep needs to see a given difference."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from prefect_harbor.cli.compare import Run
from prefect_harbor.cli.console import VisibleConsole
from prefect_harbor.outcome import figure
from prefect_harbor.stats.planning import ALPHA, ATTEMPTS, POWER, Plan
from prefect_harbor.stats.planning import plan as make_plan


def plan(
    run: Run,
    difference: Annotated[float, typer.Option(min=0.0001, help="The change in mean reward to detect (candidate − baseline, either way), e.g. 0.05.")],
    power: Annotated[float, typer.Option(min=0.5, max=0.999, help="The chance of detecting it when it is there.")] = POWER,
    alpha: Annotated[float, typer.Option(min=0.001, max=0.2, help="The test's significance level (two-sided).")] = ALPHA,
    attempts: Annotated[list[int] | None, typer.Option(min=1, help="Attempts per row to plan for (repeat the option; default 1, 2, 4, 8).")] = None,
    storage_block: Annotated[str | None, typer.Option(help="Credentials for the run folder from a saved Results Storage block.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout.")] = False,
) -> None:
    """Rows × attempts two runs need for compare to detect DIFFERENCE (paired test, 80% power), from RUN's own spread."""
    from prefect_harbor.cli.commands import fail, open_run

    table = open_run(run, storage_block).read_table()
    if table.num_rows == 0:
        raise fail(f"{run} holds no results (no results.parquet, no parts): is it a sweep run folder?")
    try:
        made = make_plan(table.to_pylist(), difference, power, alpha, attempts or ATTEMPTS)
    except ValueError as error:
        raise fail(f"{run}: {error}") from None
    if as_json:
        typer.echo(made.model_dump_json())
    else:
        print_plan(made, VisibleConsole())


def print_plan(made: Plan, console: VisibleConsole) -> None:
    spread = made.spread
    source = (
        f"the whole variance of {spread.attempts} single attempts, an upper bound (a run with several attempts per row gives a closer plan)"
        if spread.within_is_bound else f"the spread of {spread.attempts} attempts within their {spread.rows} rows"
    )  # fmt: skip
    console.print(
        f"To detect a change of {made.difference:g} in mean reward with {made.power:.0%} power (paired test, α = {made.alpha:g}), "
        f"from σ²_w = {figure(spread.within)}: {escape(source)}.", highlight=False, soft_wrap=True,
    )  # fmt: skip
    table = Table("attempts per row", "rows", "trials per run", f"detectable with this run's {spread.rows} rows", title="Each of the two runs needs", title_justify="left")
    for option in made.options:
        rows = "more than 1,000,000" if option.rows is None else f"{option.rows:,}"
        trials = "-" if option.trials is None else f"{option.trials:,}"
        table.add_row(str(option.attempts), rows, trials, figure(option.detectable_now))
    console.print(table)
    console.print(f"Assumes {made.assumptions}.", highlight=False, soft_wrap=True)
