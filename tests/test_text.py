"""Task-controlled text reaches the console and Prefect with its control characters shown, never obeyed."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_harbor.text import VisibleControls, visible, visible_logs, visible_values

#: What a hostile verifier prints: a window title, a clear screen, a hyperlink hiding its target,
#: a clipboard write, a cursor move up and a line erased, a bare carriage return, a C1 CSI.
HOSTILE = (
    "\x1b]0;pwned\x07"
    "\x1b[2J"
    "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
    "\x1b]52;c;cm0gLXJmIH4=\x07"
    "\x1b[1A\x1b[2K"
    "checking\rreward 1"
    "\x9b2J"
)
#: Any character a terminal obeys rather than shows (tab and newline are text).
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def test_escape_sequences_are_shown_as_text():
    shown = visible(HOSTILE)
    assert not CONTROLS.search(shown)
    assert shown.startswith("\\x1b]0;pwned\\x07\\x1b[2J")
    assert "checking\\x0dreward 1" in shown and shown.endswith("\\x9b2J")


def test_tabs_newlines_and_unicode_text_are_kept_as_they_are():
    text = "naïve Ærø 日本語 🎉 👩‍💻 ✔\tcolumn\nnext line\n"
    assert visible(text) is text


def test_a_windows_line_end_is_a_newline_and_a_lone_carriage_return_is_shown():
    assert visible("one\r\ntwo\r") == "one\ntwo\\x0d"


def test_showing_twice_changes_nothing_more():
    assert visible(visible(HOSTILE)) == visible(HOSTILE)


def test_every_string_of_an_artifacts_rows_is_shown_keys_included():
    rows = [{"row": "r\x1b[2J", "reward": 1.0, "rewards": {"k\x07": 0.5}, "tags": ("a\x9b",), "none": None}]
    assert visible_values(rows) == [{"row": "r\\x1b[2J", "reward": 1.0, "rewards": {"k\\x07": 0.5}, "tags": ["a\\x9b"], "none": None}]


def captured(logger_name: str) -> tuple[logging.Logger, io.StringIO]:
    """A logger whose records reach a handler on the root logger (as Prefect's console handler is), formatted into a buffer."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    logging.getLogger().addHandler(handler)
    logger = logging.getLogger(logger_name)
    logger.setLevel(logging.INFO)
    return logger, buffer


def test_a_propagated_record_and_its_traceback_reach_the_handler_shown():
    logger, buffer = captured("harbor.test_text.trial")  # propagates: a filter on this logger alone would be passed by
    try:
        with visible_logs():
            logger.info("verifier said: %s", HOSTILE)
            try:
                raise RuntimeError(f"build failed:\n{HOSTILE}")
            except RuntimeError:
                logger.exception("image build failed")
        logger.info("after the flow: \x1b[2J")
    finally:
        logging.getLogger().handlers.pop()
    during, after = buffer.getvalue().split("after the flow: ")
    assert not CONTROLS.search(during) and "verifier said: \\x1b]0;pwned" in during and "RuntimeError: build failed:\n\\x1b]0;pwned" in during
    assert after == "\x1b[2J\n", "outside the block the handler is as it was"


def test_a_record_whose_arguments_do_not_fit_is_left_to_its_handler():
    record = logging.LogRecord("t", logging.INFO, __file__, 1, "%d rows", ("many",), None)
    assert VisibleControls().filter(record) is True
    assert (record.msg, record.args) == ("%d rows", ("many",))


def test_prefects_run_logger_handlers_and_loggings_last_resort_get_the_filter():
    """get_run_logger's records are handled by the API handler on ``prefect.flow_runs``/``prefect.task_runs``
    and by the console handler on the root; a command without handlers prints warnings through the last resort."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.logging.handlers import APILogHandler, PrefectConsoleHandler

    ensure_logging_setup()  # as in any process that imported ``prefect.flow``
    api = [h for name in ("prefect.flow_runs", "prefect.task_runs") for h in logging.getLogger(name).handlers if isinstance(h, APILogHandler)]
    console = [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    assert len(api) == 2 and len(console) == 1
    handlers = [*api, *console]
    with visible_logs():
        for handler in [*handlers, logging.lastResort]:
            record = logging.LogRecord("prefect.task_runs", logging.INFO, __file__, 1, "Row r: %s", (HOSTILE,), None)
            assert handler.filter(record) and not CONTROLS.search(record.getMessage())
    assert not any(isinstance(f, VisibleControls) for h in [*handlers, logging.lastResort] for f in h.filters)


def test_a_sweeps_log_records_are_redacted_then_shown():
    from prefect_harbor.flows.configuration import sweep_logs
    from prefect_harbor.secrets import Redactor

    key = "sk-test-0123456789abcdef"
    logger, buffer = captured("prefect_harbor.test_text.sweep")
    try:
        with sweep_logs(Redactor.of([key])):
            logger.info(f"reward.json holds {key}\x1b[1A{key}")
    finally:
        logging.getLogger().handlers.pop()
    assert buffer.getvalue() == "reward.json holds [REDACTED]\\x1b[1A[REDACTED]\n"


def failed_row(**fields):
    from prefect_harbor.storage.results import RowResult

    values = {"row_id": "r0", "task": "t", "status": "failure", "err_category": "verifier_error", "err_message": f"test.sh printed {HOSTILE}"} | fields
    return RowResult(row_index=0, **values)


def test_a_rows_task_run_state_message_is_shown():
    from prefect_harbor.tasks.trial import outcome_state

    state = outcome_state([failed_row(verifier_tampering=["tests/\x1b[2Jtest.sh changed"])])
    assert not CONTROLS.search(state.message or "") and "test.sh printed \\x1b]0;pwned" in state.message


def test_the_report_artifacts_markdown_shows_a_failures_escapes():
    from prefect_harbor.flows.reporting import report_markdown
    from prefect_harbor.storage.results import RunTally

    tally = RunTally()
    tally.add(failed_row(row_id="r\x1b[2J", task="t\x9b"))
    report = report_markdown(tally.summary("run1", "file:///results.parquet"), tally)
    assert not CONTROLS.search(report) and "test.sh printed \\x1b]0;pwned" in report and "| r\\x1b[2J | t\\x9b |" in report


async def test_the_row_table_artifact_shows_a_rows_escapes(monkeypatch):
    from prefect_harbor.flows import reporting
    from prefect_harbor.storage.results import RunTally

    published = []

    async def artifact(key: str, table: list[dict], description: str) -> None:
        published.append(table)

    monkeypatch.setattr(reporting, "acreate_table_artifact", artifact)
    tally = RunTally()
    tally.add(failed_row(task="t\x1b]0;x\x07"))
    await reporting.RowsTable(tally, 1).publish("rows")
    (table,) = published
    assert not CONTROLS.search(json.dumps(table, ensure_ascii=False))
    assert table[0]["message"].startswith("test.sh printed \\x1b]0;pwned") and table[0]["task"] == "t\\x1b]0;x\\x07"


def test_the_command_lines_console_shows_escapes_in_strings_and_table_cells():
    from rich.table import Table

    from prefect_harbor.cli.console import VisibleConsole

    buffer = io.StringIO()
    console = VisibleConsole(file=buffer, force_terminal=True, width=300)  # a terminal: rich styles with its own escapes
    table = Table("row", title="Rows \x1b]0;t\x07")
    table.add_row(f"r {HOSTILE}")
    console.print(table)
    console.print(f"[red]failed[/] {HOSTILE}", highlight=False, soft_wrap=True)
    out = buffer.getvalue()
    assert "\\x1b]0;pwned\\x07" in out and "Rows \\x1b]0;t\\x07" in out
    for obeyed in ("\x1b]", "\x1b[2J", "\x1b[1A", "\x07", "\x9b", "\r"):
        assert obeyed not in out, repr(obeyed)
    assert "\x1b[31m" in out, "the console's own styling still reaches the terminal"


def test_compare_prints_rows_whose_ids_and_tasks_hold_escapes_shown(tmp_path: Path):
    from prefect_harbor.cli.commands import app
    from prefect_harbor.storage.results import RowResult
    from prefect_harbor.storage.run_store import RunStore

    def run(run_id: str, reward: float) -> str:
        store = RunStore(str(tmp_path), run_id, fallback_dir=tmp_path / "fallback")
        store.write_rows([RowResult(row_index=0, row_id="r\x1b[2J", task="t\x1b]0;pwned\x07", agent="oracle", status="success", reward=reward)])
        store.compact()
        return str(tmp_path / run_id)

    answer = CliRunner().invoke(app, ["compare", run("a", 1.0), run("b", 0.0)], env={"COLUMNS": "300"})
    assert answer.exit_code == 0, answer.output
    assert not CONTROLS.search(answer.output.replace("\n", ""))
    assert "r\\x1b[2J" in answer.output and "t\\x1b]0;pwned\\x07" in answer.output


@pytest.mark.parametrize("task", ["t\x1b[2J", "naïve 🎉"])
def test_the_sweeps_summary_shows_a_task_name_as_text(task, capsys):
    from prefect_harbor.cli.commands import print_summary
    from prefect_harbor.storage.results import SweepSummary, TaskScore

    summary = SweepSummary(
        run_id="r", results_uri="file:///r/results.parquet", rows=1, success=1, failure=0, cancelled=0, mean_reward=1.0, per_task={task: TaskScore(rows=1, mean_reward=1.0)}
    )
    print_summary(summary)
    out = capsys.readouterr().out
    assert visible(task) in out and not CONTROLS.search(out.replace("\n", ""))
