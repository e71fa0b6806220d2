"""``prefect-harbor compare RUN_A RUN_B``: what changed between two runs of the same rows, and the tables that show a run's figures.

Exit code 0 whatever the comparison found, so it can be read in scripts. For CI:
``--fail-on-regression`` exits 1 when the overall difference or a task's is *worse* beyond chance
(its paired test's p-value, Holm-adjusted across tasks, below 0.05), and ``--fail-if-worse DELTA``
when the overall mean reward dropped by more than DELTA, however sure.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_harbor.cli.console import VisibleConsole
from prefect_harbor.outcome import figure
from prefect_harbor.stats.compare import Comparison, compare_tables, signed
from prefect_harbor.stats.render import difference_cells, difference_text, outcome_text, tokens_text
from prefect_harbor.stats.summary import RunStatistics

Run = Annotated[str, typer.Argument(help="A run folder, <results root>/<run_id> (a path or an fsspec URL such as s3://bucket/results/<run_id>).")]


def compare(
    baseline: Run,
    candidate: Run,
    storage_block: Annotated[str | None, typer.Option(help="Credentials for both run folders from a saved Results Storage block.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON on stdout (every changed row).")] = False,
    fail_if_worse: Annotated[
        float | None, typer.Option(min=0, help="Exit 1 when the overall mean reward dropped by more than this (candidate − baseline < −DELTA).")
    ] = None,
    fail_on_regression: Annotated[
        bool, typer.Option(help="Exit 1 when the overall difference or a task's is worse beyond chance (paired test, Holm-adjusted p < 0.05).")
    ] = False,
    rows: Annotated[int, typer.Option(min=0, help="How many changed rows to list (--json lists all).")] = 20,
) -> None:
    """Compare two runs of the same rows: paired differences (95% intervals) overall and per task, and the rows that changed outcome."""
    from prefect_harbor.cli.commands import err, fail, open_run
    from prefect_harbor.storage.reading import DamagedFile

    tables, manifests = [], []
    for name in (baseline, candidate):
        store = open_run(name, storage_block)
        table = store.read_table()
        if table.num_rows == 0:
            raise fail(f"{name} holds no results (no results.parquet, no parts): is it a sweep run folder?")
        tables.append(table)
        try:
            manifests.append(store.read_manifest())
        except (FileNotFoundError, DamagedFile):
            manifests.append(None)
    comparison = compare_tables(*tables, baseline, candidate).of_runs(*manifests)
    for caveat in comparison.caveats():
        err.print(f"[yellow]note:[/] {escape(caveat)}", highlight=False, soft_wrap=True)
    if as_json:
        typer.echo(comparison.model_dump_json())
    else:
        print_comparison(comparison, VisibleConsole(), rows_listed=rows)
    if fail_on_regression and comparison.regressed():
        err.print(f"[red]regressed beyond chance:[/] {escape(', '.join(comparison.regressed()))}", highlight=False)
        raise typer.Exit(code=1)
    if fail_if_worse is not None:
        difference = comparison.difference.difference
        if difference is None:
            raise fail("--fail-if-worse: no row was scored in both runs, so there is nothing to compare; check that they ran the same dataset")
        if difference.mean < -fail_if_worse:
            err.print(f"[red]worse:[/] the mean reward moved by {signed(difference.mean)}, more than the {fail_if_worse:g} allowed", highlight=False)
            raise typer.Exit(code=1)


def print_comparison(comparison: Comparison, console: Console, rows_listed: int = 20) -> None:
    """The comparison for a terminal: the overall line, per-task differences, the changed rows."""
    console.print(f"{escape(comparison.candidate)} against {escape(comparison.baseline)}: {comparison.phrase()}", highlight=False, soft_wrap=True)
    console.print(f"Overall difference: {difference_text(comparison.difference)} over {comparison.paired_rows} rows scored in both", highlight=False)
    columns = ("task", "rows", "before", "after", "difference", "95% CI", "p (Holm)", "verdict")
    table = Table(*columns, title="Per task (candidate − baseline)", title_justify="left")
    for task, d in comparison.per_task.items():
        table.add_row(escape(task), *difference_cells(d))
    console.print(table)
    if comparison.changed and rows_listed:
        changed = Table("row", "task", "before", "after", title=f"Rows that changed outcome ({len(comparison.changed)})", title_justify="left")
        for change in comparison.changed[:rows_listed]:
            changed.add_row(escape(change.row_id), escape(change.task), outcome_text(change.baseline), outcome_text(change.candidate))
        console.print(changed)
        if len(comparison.changed) > rows_listed:
            console.print(f"… and {len(comparison.changed) - rows_listed} more (--json lists them all)")


def statistics_table(statistics: RunStatistics, title: str) -> Table:
    """Per task and overall: rows (and trials with several attempts), mean reward with its 95% interval,
    pass@1 and pass@k at the top k (with several attempts; every k is in summary.json), tokens and cost when reported."""
    several = statistics.attempts > 1
    ks = sorted({1, statistics.attempts} & set(statistics.pass_at_k)) if several else []
    usage = statistics.tokens.input_tokens is not None or statistics.tokens.cost_usd is not None
    table = Table(title=title, title_justify="left")
    table.add_column("task", overflow="fold", min_width=min(40, max(len(name) for name in (*statistics.per_task, "(all)"))))
    table.add_column("rows", justify="right")
    if several:
        table.add_column("trials", justify="right")
    table.add_column("mean", justify="right")
    table.add_column("95% CI", justify="right", no_wrap=True)
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    if usage:
        table.add_column("tokens, cost", justify="right", overflow="fold")
    for name, figures in (*statistics.per_task.items(), ("(all)", statistics)):
        estimate = figures.reward
        ci = "-" if estimate is None or estimate.ci95 is None else f"{figure(estimate.ci95[0])} to {figure(estimate.ci95[1])}"
        cells = [escape(name), str(figures.rows), *([str(figures.trials)] if several else []), figure(estimate.mean if estimate else None), ci]
        cells += [figure(figures.pass_at_k.get(k)) for k in ks] + ([tokens_text(figures.tokens)] if usage else [])
        table.add_row(*cells)
    return table
