"""What a sweep shows in the Prefect UI: stable-key artifacts on the flow run, their text through :func:`~prefect_harbor.text.visible`."""

from __future__ import annotations

import asyncio
import contextvars
import re
import time
from datetime import UTC, datetime
from uuid import UUID

from prefect.artifacts import (
    TableArtifact,
    acreate_link_artifact,
    acreate_markdown_artifact,
    acreate_progress_artifact,
    acreate_table_artifact,
    aupdate_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.runtime import flow_run

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.config import MODELLESS_AGENTS
from prefect_harbor.flows.configuration import is_reference, referenced_block_name
from prefect_harbor.outcome import figure, rounded
from prefect_harbor.stats.render import comparison_markdown, statistics_markdown, summary_columns
from prefect_harbor.storage.results import RunTally, SweepSummary
from prefect_harbor.text import visible, visible_values

SUMMARY_KEY = "evaluation-sweep-summary"
REPORT_KEY = "evaluation-sweep-report"
RESULTS_LINK_KEY = "evaluation-sweep-results"
PROGRESS_KEY = "evaluation-sweep-progress"
ROWS_KEY = "evaluation-sweep-rows"


#: How a sweep's run name ends: ``-<UTC date>-<time>``.
_NAMED = re.compile(r"-\d{8}-\d{4}$")


def sweep_run_name() -> str:
    """``<backend block or agent>-<dataset stem>-<UTC date>``: runs told apart in the UI's list.

    A Retry runs the same flow run again and keeps the name it was given (the date is the first run's)."""
    if flow_run.run_count > 0 and _NAMED.search(flow_run.name or ""):
        return flow_run.name
    parameters = flow_run.parameters
    backend = parameters.get("backend")
    picked = referenced_block_name(backend) if is_reference(backend) else getattr(backend, "_block_document_name", None)
    who = parameters.get("backend_block") or picked or getattr(backend, "agent_spec", None) or "sweep"
    dataset = str(parameters.get("dataset") or "dataset").rstrip("/").rsplit("/", 1)[-1].split(".", 1)[0]
    return f"{who}-{dataset}-{datetime.now(UTC):%Y%m%d-%H%M}".replace(":", "-")


def run_tags(config: HarborBackend, block_name: str | None) -> list[str]:
    """The flow run's tags: its agent, model, task mode and backend block (filterable in the UI)."""
    tags = [f"agent:{config.agent or config.workflow_agent or 'workflow'}", f"mode:{config.task_mode}"]
    if config.agent not in MODELLESS_AGENTS:
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

    def __init__(self, total: int, interval: float = PROGRESS_INTERVAL_SECONDS, key: str = PROGRESS_KEY):
        """``key``: a shard of a sweep on many hosts keeps its own (the sweep's shows the whole run)."""
        self.key = key
        self.total = max(total, 1)
        self.done = 0
        self.shown = -1.0
        self.shown_at: float | None = None  # not time 0: the monotonic clock starts near the machine's boot
        self.interval = interval
        self.artifact_id: UUID | None = None

    async def start(self) -> None:
        self.artifact_id = await acreate_progress_artifact(0.0, key=self.key, description="Rows finished (%)")

    def skip(self) -> None:
        """A row that needs no work (kept from a resumed run): counted, shown with the next update."""
        self.done += 1

    async def advance(self) -> None:
        await self.reach(self.done + 1)

    async def reach(self, done: int) -> None:
        """``done`` rows have finished (counted elsewhere: the shards of a sweep on many hosts)."""
        self.done = done
        percent = round(100 * self.done / self.total, 1)
        due = percent > self.shown and (self.shown_at is None or time.monotonic() - self.shown_at >= self.interval)
        if self.artifact_id is not None and (due or self.done == self.total):
            self.shown, self.shown_at = percent, time.monotonic()
            await aupdate_progress_artifact(self.artifact_id, percent)

    async def finish(self, recorded: int) -> None:
        """The final count: every row has a result by now, cancelled ones included (a cancel left it at the last update)."""
        percent = round(100 * recorded / self.total, 1)
        if self.artifact_id is not None and percent != self.shown:
            self.shown = percent
            await aupdate_progress_artifact(self.artifact_id, percent)


#: The report names at most this many rows an earlier attempt recorded that ran again.
SUPERSEDED_LISTED = 50


def report_markdown(summary: SweepSummary, tally: RunTally, superseded: list[str] = ()) -> str:
    """Failures grouped by category with their messages (the first few of each), the rows a retry
    ran again (whose earlier task runs are superseded), then the slowest rows; control characters shown, not obeyed."""
    lines = [
        f"# Sweep {summary.run_id}",
        "",
        f"{summary.counted()}; {summary.mean_phrase(no_mean='no row was scored, so there is no mean reward')}.",
        "",
        f"Results: `{summary.results_uri}`",
    ]
    if summary.verifier_tampering and summary.statistics is None:  # the statistics say it otherwise
        lines += ["", f"**Verifier tampering**: {summary.verifier_tampering} row(s) with evidence that the agent tampered with its verifier (the `verifier_tampering` column)."]
    if summary.local_fallback:
        lines += ["", f"**Storage was unavailable**: {len(summary.unsent_files)} file(s) kept locally in `{summary.local_fallback}`."]
    if summary.statistics is not None:
        lines += ["", statistics_markdown(summary.statistics)]
    if summary.comparison is not None:
        lines += ["", comparison_markdown(summary.comparison, "Compared with this deployment's previous sweep")]
    lines += ["", "## Failures", ""]
    if not tally.failure_counts:
        lines.append("None.")
    several = summary.attempts > 1  # a row fails once per attempt: say which
    columns = ["row", *(["attempt"] * several), "task", "phase", "message"]
    for category, count in sorted(tally.failure_counts.items()):
        rows = tally.failures[category]
        lines += [f"### {category} ({count})", "", _table_line(columns), _table_line(["---"] * len(columns))]
        lines += [_table_line([r.row_id, *([str(r.attempt)] * several), r.task or "-", r.err_phase or "-", _cell(r.err_message)]) for r in rows]
        if count > len(rows):
            lines.append(f"| … | {count - len(rows)} more in the results table |" + " |" * (len(columns) - 2))
        lines.append("")
    if superseded:
        listed = ", ".join(superseded[:SUPERSEDED_LISTED]) + (f" and {len(superseded) - SUPERSEDED_LISTED} more" if len(superseded) > SUPERSEDED_LISTED else "")
        lines += [
            "## Rows run again", "",
            f"This run continues an earlier attempt (Prefect's Retry, or --resume). {len(superseded)} row(s) it had recorded as cancelled "
            f"ran again: their earlier task runs (Cancelled) are superseded by this run's, and the results hold only the new outcome: {listed}.",
            "",
        ]  # fmt: skip
    lines += ["## Slowest rows", "", "| row | task | total s | agent s | verifier s |", "|---|---|---|---|---|"]
    lines += [f"| {r.row_id} | {r.task or '-'} | {figure(r.total_sec)} | {figure(r.agent_sec)} | {figure(r.verifier_sec)} |" for r in tally.slowest()]
    return visible("\n".join(lines) + "\n")


#: The row table is published again, while the sweep runs, this often (seconds) or every this many rows, whichever comes first.
ROWS_TABLE_SECONDS = 30.0
ROWS_TABLE_ROWS = 100


async def aupdate_table_artifact(artifact_id: UUID, table: list[dict], description: str) -> None:
    """Replace a table artifact's rows and description in place (Prefect updates its key's latest too),
    the rows stored as ``acreate_table_artifact`` stores them."""
    data = await TableArtifact(table=table).aformat()
    async with get_client() as client:
        await client.update_artifact(artifact_id, ArtifactUpdate(data=data, description=description))


class RowsTable:
    """The ``evaluation-sweep-rows`` artifact (row, task, status, reward, category, message, archive),
    published while the sweep runs and updated in place, so the run shows one table, not a card
    per version: after the first row to finish, then every :data:`ROWS_TABLE_ROWS` rows or
    :data:`ROWS_TABLE_SECONDS` seconds, and at the end. It lists the first ``tally.rows_kept``
    rows to finish; every row is in the results."""

    def __init__(self, tally: RunTally, total: int, interval: float = ROWS_TABLE_SECONDS, every: int = ROWS_TABLE_ROWS, key: str = ROWS_KEY):
        self.tally, self.total, self.interval, self.every, self.key = tally, total, interval, every, key
        self.shown_rows = 0
        self.shown_at: float | None = None
        self.artifact_id: UUID | None = None
        # Made in the flow run: published from a row's task run, the artifact would be filed under that task run.
        self._flow_context = contextvars.copy_context()

    async def advance(self) -> None:
        """A row finished: publish if it is the first, or enough rows or time went by since the last time."""
        listed = len(self.tally.first_rows)
        new_rows = listed - self.shown_rows
        if new_rows <= 0:
            return
        if self.shown_at is None or new_rows >= self.every or time.monotonic() - self.shown_at >= self.interval:
            await self.publish(f"Row by row, as they finish: {self.tally.rows} of {self.total} so far.")

    async def publish(self, description: str) -> None:
        """The table as it stands: made the first time, filed under the flow run (whichever row's task run
        finished last), then updated in place."""
        rows = sorted(self.tally.first_rows, key=lambda row: row["index"])
        self.shown_rows, self.shown_at = len(rows), time.monotonic()
        table = visible_values([{key: value for key, value in row.items() if key != "index"} for row in rows])
        if self.artifact_id is None:
            made = acreate_table_artifact(key=self.key, table=table, description=description)
            self.artifact_id = await asyncio.create_task(made, context=self._flow_context.copy())
        else:
            await aupdate_table_artifact(self.artifact_id, table, description)

    async def finish(self, summary: SweepSummary) -> None:
        listed = len(self.tally.first_rows)
        unit = "rows" if summary.attempts == 1 else "trials"
        await self.publish(f"Row by row: the first {listed} of {summary.trials} {unit} to finish; every one is in {summary.results_uri}")


def trials(count: int, attempts: int) -> dict[str, int]:
    """The summary table's trials column, with several attempts per row (with one, trials are the rows)."""
    return {"trials": count} if attempts > 1 else {}


async def publish(summary: SweepSummary, tally: RunTally, superseded: list[str] = ()) -> None:
    """The summary, report and results-location artifacts (figures rounded for people; the files keep full precision)."""
    await acreate_table_artifact(
        key=SUMMARY_KEY,
        table=visible_values([
            {"task": "(all)", "rows": summary.rows, **trials(summary.trials, summary.attempts), "success": summary.success, "failure": summary.failure,
             "cancelled": summary.cancelled,
             "agent_failures": summary.agent_failures, "not_scored": sum(summary.not_scored.values()),
             "mean_reward": rounded(summary.mean_reward), **summary_columns(summary.statistics)},
            *[
                {"task": task, "rows": score.rows, **trials(score.trials, summary.attempts), "success": score.success, "failure": score.failure, "cancelled": score.cancelled,
                 "agent_failures": score.agent_failures, "not_scored": score.not_scored,
                 "mean_reward": rounded(score.mean_reward), **summary_columns(summary.statistics, task)}
                for task, score in summary.per_task.items()
            ],
        ]),  # fmt: skip
        description=f"Sweep {summary.run_id}: rows per status and mean reward (agent failures count as 0, not-scored attempts are left out; 95% interval, pass@k, "
            f"tokens, cost; 3 significant digits, summary.json has them in full), overall and per task.",
    )
    await acreate_markdown_artifact(
        key=REPORT_KEY, markdown=report_markdown(summary, tally, superseded), description="How sure, what changed, what it cost; failures and slowest rows"
    )
    if summary.results_uri.startswith(("http://", "https://")):
        await acreate_link_artifact(key=RESULTS_LINK_KEY, link=summary.results_uri, link_text="results.parquet", description="The results table")
    else:  # file:// and s3:// are not links a browser opens: say where the table is, to copy
        where = "a local file on the machine that ran the sweep" if summary.results_uri.startswith("file://") else "in object storage"
        path = summary.results_uri.removeprefix("file://")
        await acreate_markdown_artifact(
            key=RESULTS_LINK_KEY, markdown=f"The results table is {where}; copy its location:\n\n```\n{path}\n```\n", description="The results table"
        )




def _table_line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cell(text: str | None) -> str:
    return (text or "-").replace("|", "\\|").replace("\n", " ")[:300]
