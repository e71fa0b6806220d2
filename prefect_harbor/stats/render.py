"""A run's statistics and a comparison in words: the headline's few, the report's tables, the CLI's lines.

Figures are rounded for reading (three significant digits); ``summary.json`` and the results
table keep them in full.
"""

from __future__ import annotations

from prefect_harbor.outcome import figure, rounded
from prefect_harbor.stats.compare import DIFFERENT_DATASETS, Comparison, TaskDifference, signed
from prefect_harbor.stats.estimators import Estimate
from prefect_harbor.stats.summary import Figures, RunStatistics, Tokens

#: The report lists at most this many rows that changed outcome (every one is in summary.json).
CHANGES_LISTED = 50


def interval(estimate: Estimate | None) -> str:
    """``95% CI 0.59 to 1.12``, or why there is none."""
    if estimate is None:
        return "nothing scored"
    if estimate.ci95 is None:
        return estimate.method
    low, high = estimate.ci95
    return f"95% CI {figure(low)} to {figure(high)}"


def pass_at_top(figures: Figures) -> str | None:
    """``pass@3 0.9``: pass@k at the largest k, or None without pass@k."""
    if not figures.pass_at_k:
        return None
    k = max(figures.pass_at_k)
    return f"pass@{k} {figure(figures.pass_at_k[k])}"


def headline_figures(statistics: RunStatistics | None) -> str:
    """The few words a headline adds after the mean: ``(95% CI 0.59 to 1.12; pass@3 0.9)``."""
    if statistics is None or statistics.reward is None:
        return ""
    parts = [interval(statistics.reward)]
    if statistics.attempts > 1 and (top := pass_at_top(statistics)):
        parts.append(top)
    return f" ({'; '.join(parts)})"


def tokens_text(tokens: Tokens) -> str:
    """``12,345 input (1,000 cached), 678 output tokens; $0.0123``, or ``-`` when nothing was reported."""
    if tokens.input_tokens is None and tokens.output_tokens is None and tokens.cost_usd is None:
        return "-"
    counted = f"{tokens.input_tokens or 0:,} input ({tokens.cached_tokens or 0:,} cached), {tokens.output_tokens or 0:,} output tokens"
    return counted + ("" if tokens.cost_usd is None else f"; ${tokens.cost_usd:.4g}")


def statistics_markdown(statistics: RunStatistics) -> str:
    """The report's statistics: overall, per task, usage, and how the figures were computed."""
    k = statistics.attempts
    ks = sorted({k2 for figures in (statistics, *statistics.per_task.values()) for k2 in figures.pass_at_k})
    lines = [
        "## How sure are we", "",
        f"Mean reward {figure(statistics.reward.mean if statistics.reward else None)} ({interval(statistics.reward)}) over "
        f"{statistics.scored} scored attempts of {statistics.rows} rows" + (f" × {k} attempts" if k > 1 else "") + ".",
        "",
        f"Interval: {statistics.reward.method if statistics.reward else '-'}; mean over attempts with a reward (failed attempts are counted, not scored).",
        "",
        "| task | rows | trials | scored | mean | 95% CI | " + " | ".join(f"pass@{n}" for n in ks) + (" |" if ks else "") + " tokens |",
        "|---|---|---|---|---|---|" + "---|" * len(ks) + "---|",
    ]  # fmt: skip
    for name, figures in (("(all)", statistics), *statistics.per_task.items()):
        ci = "-" if figures.reward is None or figures.reward.ci95 is None else f"{figure(figures.reward.ci95[0])} to {figure(figures.reward.ci95[1])}"
        passes = "".join(f" {figure(figures.pass_at_k.get(n))} |" for n in ks)
        mean = figure(figures.reward.mean if figures.reward else None)
        lines.append(f"| {name} | {figures.rows} | {figures.trials} | {figures.scored} | {mean} | {ci} |{passes} {tokens_text(figures.tokens)} |")
    lines.append("")
    if statistics.pass_at_k:
        lines.append("pass@k: the unbiased estimator (Chen et al. 2021, Harbor's `compute_pass_at_k_by_evals`), a row being one problem; an attempt that finished "
            "without a reward counts as not passed, cancelled attempts count for neither.")
    else:
        lines.append(f"pass@k: not given ({statistics.pass_at_k_note}).")
    usage = tokens_text(statistics.tokens)
    lines += ["", "What it cost: no tokens or cost reported by the agent." if usage == "-" else f"What it cost: {usage} (input includes cached, as Harbor counts it)."]
    if statistics.verifier_flagged:
        lines += ["", f"**{statistics.verifier_flagged} attempt(s) had their verifier output flagged as tampered with** (the `verifier_tampering` column)."]
    return "\n".join(lines) + "\n"


def comparison_markdown(comparison: Comparison, title: str = "What changed") -> str:
    """The report's comparison: overall and per-task paired differences, then the rows that changed outcome."""
    lines = [f"## {title}", "", f"Against `{comparison.baseline}`: {comparison.phrase()}.", ""]
    if comparison.different_datasets:  # the rows in one run only are in the overall line below
        lines += [f"Note: {DIFFERENT_DATASETS}.", ""]
    lines += [
        f"Overall: {difference_text(comparison.difference)} over {comparison.paired_rows} rows scored in both runs"
        + (f"; {comparison.only_in_baseline} rows only in the baseline" if comparison.only_in_baseline else "")
        + (f"; {comparison.only_in_candidate} rows only in this run" if comparison.only_in_candidate else "") + ".",
        "", "| task | rows | before | after | difference | 95% CI | p (Holm) | verdict |", "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for task, d in comparison.per_task.items():
        lines.append("| " + " | ".join((task, *difference_cells(d))) + " |")
    if comparison.changed:
        lines += ["", f"Rows that changed outcome ({len(comparison.changed)}):", "", "| row | task | before | after |", "|---|---|---|---|"]
        for change in comparison.changed[:CHANGES_LISTED]:
            lines.append(f"| {change.row_id} | {change.task} | {outcome_text(change.baseline)} | {outcome_text(change.candidate)} |")
        if len(comparison.changed) > CHANGES_LISTED:
            lines.append(f"| … | {len(comparison.changed) - CHANGES_LISTED} more in summary.json | | |")
    return "\n".join(lines) + "\n"


def difference_cells(d: TaskDifference) -> tuple[str, ...]:
    """A task's row of the comparison table after its name: rows, before, after, difference, 95% CI, p (Holm), verdict."""
    moved = signed(d.difference.mean) if d.difference else "-"
    ci = "-" if d.difference is None or d.difference.ci95 is None else f"{signed(d.difference.ci95[0])} to {signed(d.difference.ci95[1])}"
    p = "-" if d.p_adjusted is None else f"{d.p_adjusted:.2g}"
    return str(d.rows), figure(d.baseline_mean), figure(d.candidate_mean), moved, ci, p, d.verdict


def difference_text(difference: TaskDifference) -> str:
    """``−0.143 (95% CI −0.4 to +0.11; p=0.3, could be chance: no clear change)``."""
    if difference.difference is None:
        return "nothing to compare"
    estimate = difference.difference
    ci = estimate.method if estimate.ci95 is None else f"95% CI {signed(estimate.ci95[0])} to {signed(estimate.ci95[1])}"
    return f"{signed(estimate.mean)} ({ci}; {difference.test} {difference.sureness()}: {difference.verdict})"


def outcome_text(outcome) -> str:
    """``0.5 (1 failure, 1 success)``, or ``absent``."""
    if outcome is None:
        return "absent"
    return f"{figure(outcome.mean)} ({outcome.ended})"


def summary_columns(statistics: RunStatistics | None, task: str | None = None) -> dict[str, float | int | None]:
    """The summary table artifact's columns for the run (or one task): interval, pass@k at the top k, tokens and cost (figures rounded as the table's others)."""
    if statistics is None:
        return {}
    figures = statistics if task is None else statistics.per_task.get(task)
    if figures is None:
        return {}
    low, high = figures.reward.ci95 if figures.reward is not None and figures.reward.ci95 is not None else (None, None)
    k = statistics.attempts
    tokens = figures.tokens
    return {
        "ci95_low": rounded(low), "ci95_high": rounded(high), f"pass@{k}": rounded(figures.pass_at_k.get(k)),
        "input_tokens": tokens.input_tokens, "cached_tokens": tokens.cached_tokens, "output_tokens": tokens.output_tokens, "cost_usd": rounded(tokens.cost_usd),
    }  # fmt: skip
