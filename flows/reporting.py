"""What a sweep shows in the Prefect UI: stable-key artifacts on the flow run."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from prefect.artifacts import (
    acreate_link_artifact,
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.storage.results import RunTally, SweepSummary

SUMMARY_KEY = "evaluation-sweep-summary"
REPORT_KEY = "evaluation-sweep-report"
RESULTS_LINK_KEY = "evaluation-sweep-results"
PROGRESS_KEY = "evaluation-sweep-progress"
ROWS_KEY = "evaluation-sweep-rows"


def sweep_run_name() -> str:
    """``<backend block or agent>-<dataset stem>-<UTC date>``: runs told apart in the UI's list."""
    parameters = flow_run.parameters
    backend = parameters.get("backend")
    who = parameters.get("backend_block") or getattr(backend, "_block_document_name", None) or getattr(backend, "agent_spec", None) or "sweep"
    dataset = str(parameters.get("dataset") or "dataset").rstrip("/").rsplit("/", 1)[-1].split(".", 1)[0]
    return f"{who}-{dataset}-{datetime.now(UTC):%Y%m%d-%H%M}".replace(":", "-")


def run_tags(config: HarborBackend, block_name: str | None) -> list[str]:
    """The flow run's tags: its agent, model, task mode and backend block (filterable in the UI)."""
    tags = [f"agent:{config.agent or config.workflow_agent or 'workflow'}", f"mode:{config.task_mode}"]
    if config.agent != "oracle":
        tags.append(f"model:{(config.model_endpoint.model if config.model_endpoint else None) or config.model_name}")
    if block_name:
        tags.append(f"backend:{block_name}")
    return tags


async def tag_flow_run(flow_run_id: str, tags: list[str]) -> None:
    async with get_client() as client:
        run = await client.read_flow_run(UUID(flow_run_id))
        await client.update_flow_run(run.id, tags=sorted({*run.tags, *tags}))


#: Seconds between progress updates. An update costs ~13.7 ms of CPU (server and client,
#: ``benchmarks/server_costs.py``): every 2 s that was ~12 ms a quick row at 8 lanes (one
#: finishes every ~1.8 s); every 10 s it is ~2.5.
PROGRESS_INTERVAL_SECONDS = 10.0


class Progress:
    """A progress artifact updated as rows finish: at most every ``interval`` seconds, and at the end."""

    def __init__(self, total: int, interval: float = PROGRESS_INTERVAL_SECONDS):
        self.total = max(total, 1)
        self.done = 0
        self.shown = -1.0
        self.shown_at = 0.0
        self.interval = interval
        self.artifact_id: UUID | None = None

    async def start(self) -> None:
        self.artifact_id = await acreate_progress_artifact(0.0, key=PROGRESS_KEY, description="Rows finished (%)")

    def skip(self) -> None:
        """A row that needs no work (kept from a resumed run): counted, shown with the next update."""
        self.done += 1

    async def advance(self) -> None:
        self.done += 1
        percent = round(100 * self.done / self.total, 1)
        due = percent > self.shown and time.monotonic() - self.shown_at >= self.interval
        if self.artifact_id is not None and (due or self.done == self.total):
            self.shown, self.shown_at = percent, time.monotonic()
            await aupdate_progress_artifact(self.artifact_id, percent)

    async def finish(self, recorded: int) -> None:
        """The final count: every row has a result by now, cancelled ones included (a cancel left it at the last update)."""
        percent = round(100 * recorded / self.total, 1)
        if self.artifact_id is not None and percent != self.shown:
            self.shown = percent
            await aupdate_progress_artifact(self.artifact_id, percent)


def report_markdown(summary: SweepSummary, tally: RunTally) -> str:
    """Failures grouped by category with their messages (the first few of each), then the slowest rows."""
    lines = [
        f"# Sweep {summary.run_id}",
        "",
        f"{summary.rows} rows: {summary.success} success, {summary.failure} failure, {summary.cancelled} cancelled; "
        + (f"mean reward {_fmt(summary.mean_reward)}." if summary.mean_reward is not None else "no row was scored, so there is no mean reward."),
        "",
        f"Results: `{summary.results_uri}`",
    ]
    if summary.verifier_tampering:
        lines += ["", f"**Verifier tampering**: {summary.verifier_tampering} row(s) with evidence that the agent tampered with its verifier (the `verifier_tampering` column)."]
    if summary.local_fallback:
        lines += ["", f"**Storage was unavailable**: {len(summary.unsent_files)} file(s) kept locally in `{summary.local_fallback}`."]
    lines += ["", "## Failures", ""]
    if not tally.failure_counts:
        lines.append("None.")
    for category, count in sorted(tally.failure_counts.items()):
        rows = tally.failures[category]
        lines += [f"### {category} ({count})", "", "| row | task | phase | message |", "|---|---|---|---|"]
        lines += [f"| {r.row_id} | {r.task or '-'} | {r.err_phase or '-'} | {_cell(r.err_message)} |" for r in rows]
        if count > len(rows):
            lines.append(f"| … | {count - len(rows)} more in the results table | | |")
        lines.append("")
    lines += ["## Slowest rows", "", "| row | task | total s | agent s | verifier s |", "|---|---|---|---|---|"]
    lines += [f"| {r.row_id} | {r.task or '-'} | {_fmt(r.total_sec)} | {_fmt(r.agent_sec)} | {_fmt(r.verifier_sec)} |" for r in tally.slowest()]
    return "\n".join(lines) + "\n"


async def publish(summary: SweepSummary, tally: RunTally) -> None:
    await acreate_table_artifact(
        key=SUMMARY_KEY,
        table=[
            {"task": "(all)", "rows": summary.rows, "success": summary.success, "failure": summary.failure,
             "cancelled": summary.cancelled, "mean_reward": summary.mean_reward},
            *[{"task": task, "rows": score.rows, "mean_reward": score.mean_reward} for task, score in summary.per_task.items()],
        ],  # fmt: skip
        description=f"Sweep {summary.run_id}: rows per status and mean reward, overall and per task.",
    )
    rows = sorted(tally.first_rows, key=lambda row: row["index"])
    await acreate_table_artifact(
        key=ROWS_KEY,
        table=[{key: value for key, value in row.items() if key != "index"} for row in rows],
        description=f"Row by row: the first {len(rows)} of {summary.rows} rows to finish; every row is in {summary.results_uri}",
    )
    await acreate_markdown_artifact(key=REPORT_KEY, markdown=report_markdown(summary, tally), description="Failures and slowest rows")
    if summary.results_uri.startswith(("http://", "https://")):
        await acreate_link_artifact(key=RESULTS_LINK_KEY, link=summary.results_uri, link_text="results.parquet", description="The results table")
    else:  # file:// and s3:// are not links a browser opens: say where the table is, to copy
        where = "a local file on the machine that ran the sweep" if summary.results_uri.startswith("file://") else "in object storage"
        path = summary.results_uri.removeprefix("file://")
        await acreate_markdown_artifact(
            key=RESULTS_LINK_KEY, markdown=f"The results table is {where}; copy its location:\n\n```\n{path}\n```\n", description="The results table"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _cell(text: str | None) -> str:
    return (text or "-").replace("|", "\\|").replace("\n", " ")[:300]
