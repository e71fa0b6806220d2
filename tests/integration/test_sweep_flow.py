"""The evaluation-sweep flow on a real Prefect server, running real trials in the sandbox."""

import json
import math
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from paths import EXAMPLE_DATASET, EXAMPLE_TASKS, EXPECTED_ORACLE_REWARDS
from prefect.client.orchestration import get_client
from prefect_reads import artifacts_of, logs_of, task_runs_of
from tasks_factory import write_task
from test_cancellation import marked_processes

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.config import TrialEnvironment
from prefect_harbor.flows import evaluation_sweep
from prefect_harbor.flows.reporting import RESULTS_LINK_KEY, ROWS_KEY
from prefect_harbor.flows.reporting import SUMMARY_KEY as SUMMARY_ARTIFACT_KEY
from prefect_harbor.sandbox.engine import LABEL_OWNER, podman_sync
from prefect_harbor.sandbox.owners import owner_token

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]


def dataset_backend(tmp_path, tasks_dir=EXAMPLE_TASKS, **kwargs) -> HarborBackend:
    return HarborBackend(tasks_dir=tasks_dir, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), **kwargs)


def stray_processes(needle: str) -> list[int]:
    """Host processes whose command line holds ``needle``, except those inside a container another
    live test process owns (under pytest-xdist the other process may be running the same task)."""
    others = {
        container_id
        for container_id, owner in (
            line.split() for line in podman_sync("ps", "--no-trunc", "--format", f'{{{{.ID}}}} {{{{index .Labels "{LABEL_OWNER}"}}}}').text.splitlines() if line.strip()
        )
        if owner != owner_token()
    }  # fmt: skip
    # A process that exited meanwhile is not stray: its /proc entry is gone after container_of read it.
    return [pid for pid in marked_processes(needle) if container_of(pid) not in others and os.path.exists(f"/proc/{pid}")]


def container_of(pid: int) -> str | None:
    """The id of the podman container whose cgroup holds ``pid`` (None: none, or the process is gone)."""
    try:
        found = re.search(r"libpod-([0-9a-f]{64})", Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    return found.group(1) if found else None


async def test_the_example_sweep_scores_every_task_and_leaves_nothing_running(tmp_path):
    summary = await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend=dataset_backend(tmp_path), results=str(tmp_path / "results"), concurrency=3)

    table = pq.read_table(summary.results_uri).to_pylist()
    assert {row["task"]: row["reward"] for row in table} == EXPECTED_ORACLE_REWARDS
    assert {row["status"] for row in table} == {"success"}
    assert all(row["total_sec"] > 0 and row["verifier_sec"] is not None for row in table)
    assert dict(next(r for r in table if r["task"] == "multi-key-reward")["rewards"]) == {"reward": 1.0, "correctness": 1.0, "format": 1.0}
    count, mean = len(EXPECTED_ORACLE_REWARDS), sum(EXPECTED_ORACLE_REWARDS.values()) / len(EXPECTED_ORACLE_REWARDS)
    assert (summary.rows, summary.success, summary.mean_reward) == (count, count, pytest.approx(mean))
    # The background-process task leaves a tmux server and a ticker loop inside its sandbox.
    assert stray_processes("ticker.sh") == []
    # Successful trial directories are cleaned up.
    assert not any((tmp_path / "trials").rglob("result.json"))

    async with get_client() as client:
        artifact = await client.read_latest_artifacts()
    assert any(a.key == SUMMARY_ARTIFACT_KEY for a in artifact)


async def test_bad_rows_fail_alone_with_their_reasons(tmp_path):
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(
        "\n".join(
            [
                json.dumps({"id": "good", "metadata": {"harbor_task_id": "reward-txt"}}),
                json.dumps({"id": "zero", "metadata": {"harbor_task_id": "broken-solution"}}),
                json.dumps({"id": "unknown-task", "metadata": {"harbor_task_id": "nope"}}),
                json.dumps({"id": "escape", "metadata": {"harbor_task_id": "../../etc"}}),
                json.dumps({"id": "no-task"}),
                "{this is not json",
            ]
        )
        + "\n"
    )
    summary = await evaluation_sweep(dataset=str(dataset), backend=dataset_backend(tmp_path), results=str(tmp_path / "results"))
    rows = {row["row_id"]: row for row in pq.read_table(summary.results_uri).to_pylist()}
    assert len(rows) == 6
    assert rows["good"]["status"] == "success" and rows["zero"]["reward"] == 0.0
    assert "unknown harbor task id 'nope'" in rows["unknown-task"]["err_message"]
    assert "unknown harbor task id '../../etc'" in rows["escape"]["err_message"]
    assert "needs metadata.harbor_task_id" in rows["no-task"]["err_message"]
    malformed = next(r for r in rows.values() if r["row_index"] == 5)
    assert malformed["status"] == "failure" and "not valid JSON" in malformed["err_message"]
    assert {r["err_category"] for r in rows.values() if r["status"] == "failure"} == {"validation_error"}

    # What the Prefect UI shows: each row's task run in its outcome's state, the headline, the row table.
    async with get_client() as client:
        (flow_run,) = [r for r in await client.read_flow_runs() if r.parameters.get("results") == str(tmp_path / "results")]
        states = {r.name: r.state for r in await task_runs_of(client, flow_run.id) if r.name.startswith("row")}
        # The row table is published as rows finish, one version each time: keep the newest of each key.
        artifacts = {a.key: a for a in await artifacts_of(client, flow_run.id)}
    assert (states["row good"].type.value, states["row good"].name, states["row good"].message) == ("COMPLETED", "Reward 1", "reward 1")
    assert (states["row zero"].type.value, states["row zero"].name, states["row zero"].message) == ("COMPLETED", "Reward 0", "reward 0")
    assert (states["row unknown-task"].type.value, states["row unknown-task"].name) == ("FAILED", "Validation error")
    assert states["row unknown-task"].message.startswith("validation_error: unknown harbor task id 'nope'")
    assert states["row unknown-task"].message.endswith("; archive " + rows["unknown-task"]["artifact_uri"])
    assert flow_run.state.is_completed() and flow_run.state.message == summary.headline()
    assert flow_run.state.name == "1/6 rewarded, 4 failed, mean 0.5"
    # Two scored rows (1 and 0): the Wilson interval of 1 in 2, inside [0, 1] (a t interval said -5.85 to 6.85). The four
    # rows that never reached a trial measured nothing of the agent: not scored, and the headline says why.
    assert summary.headline().startswith(
        "6 rows: 2 success, 4 failure, 0 cancelled; mean reward 0.5 over 2 rows (95% CI 0.0945 to 0.905); 4 not scored (setup 4) — results at file://"
    ), summary.headline()
    assert flow_run.name.startswith("oracle-rows-"), flow_run.name
    assert {"agent:oracle", "mode:dataset"} <= set(flow_run.tags)
    table = json.loads(artifacts[ROWS_KEY].data)
    assert [row["row"] for row in table] == ["good", "zero", "unknown-task", "escape", "no-task", malformed["row_id"]]
    assert table[2] | {"message": None} == {
        "row": "unknown-task", "task": "nope", "status": "failure", "reward": None, "category": "validation_error",
        "archive": rows["unknown-task"]["artifact_uri"], "message": None,
    }  # fmt: skip
    assert "a local file on the machine that ran the sweep" in artifacts[RESULTS_LINK_KEY].data


async def test_template_mode_runs_the_prompt_rows_against_one_task(tmp_path):
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": f"variant {i}"}) for i in range(3)) + "\n")
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS / "reward-txt", task_mode="template", agent="oracle", trials_dir=str(tmp_path / "trials"))
    summary = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"))
    table = pq.read_table(summary.results_uri).to_pylist()
    assert [(r["row_id"], r["status"], r["reward"]) for r in table] == [(f"p{i}", "success", 1.0) for i in range(3)]


async def test_failed_trials_are_kept_and_their_directory_recorded(tmp_path):
    dataset = tmp_path / "rows.jsonl"
    task = tmp_path / "tasks" / "no-reward"
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text("[verifier]\ntimeout_sec = 30\n")
    (task / "instruction.md").write_text("nothing")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 'forgot the reward file'\n")
    dataset.write_text(json.dumps({"id": "r", "metadata": {"harbor_task_id": "no-reward"}}) + "\n")
    summary = await evaluation_sweep(dataset=str(dataset), backend=dataset_backend(tmp_path, tmp_path / "tasks"), results=str(tmp_path / "results"))
    (row,) = pq.read_table(summary.results_uri).to_pylist()
    assert (row["status"], row["exception_type"], row["err_phase"]) == ("failure", "RewardFileNotFoundError", "verifier")
    assert row["err_message"].startswith("task 'no-reward': its tests/test.sh ended without writing a reward"), row["err_message"]
    assert row["err_message"].endswith("the verifier's output ends:\nforgot the reward file"), row["err_message"]
    assert (Path(row["trial_dir"]) / "result.json").is_file()


async def test_rerun_failed_makes_a_new_run_of_only_the_failed_rows(tmp_path):
    from tasks_factory import write_task

    tasks = tmp_path / "tasks"
    write_task(tasks, "passes")
    write_task(tasks, "fails", test="printf '\\033]0;pwned\\007\\033[2J'; echo 'no reward file written'")  # a title, a cleared screen
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": n, "metadata": {"harbor_task_id": t}}) + "\n" for n, t in [("p", "passes"), ("f", "fails")]))
    backend = dataset_backend(tmp_path, tasks)
    first = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"))
    assert (first.success, first.failure) == (1, 1)
    async with get_client() as client:
        (run,) = [r for r in await client.read_flow_runs() if r.parameters.get("results") == str(tmp_path / "results")]
        logs = await logs_of(client, run.id)
    assert any("\\x1b]0;pwned\\x07\\x1b[2J" in message for message in logs), "the verifier's output is in the log, as text"
    assert not any("\x1b" in message or "\x07" in message for message in logs), logs
    first_folder = first.results_uri.removeprefix("file://").rsplit("/", 1)[0]

    # The verifier shares the agent's sandbox (Harbor's shared mode): its failure counts against the agent, so a rerun takes it only when asked.
    from prefect_harbor.config import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"its 1 agent failures run again with rerun_agent_failures"):
        await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"), rerun_failed=first_folder)
    second = await evaluation_sweep(
        dataset=str(dataset), backend=backend, results=str(tmp_path / "results"), rerun_failed=first_folder, rerun_agent_failures=True
    )
    assert second.run_id != first.run_id
    (row,) = pq.read_table(second.results_uri).to_pylist()
    assert row["row_id"] == "f~rerun" and row["status"] == "failure"
    manifest = json.loads(Path(second.results_uri.removeprefix("file://")).with_name("manifest.json").read_text())
    assert manifest["rerun_of"] == first_folder and manifest["dataset"]["rows"] == 1


async def test_retries_given_to_the_flow_are_refused_before_any_trial(tmp_path):
    from prefect_harbor.config import ConfigurationError

    with pytest.raises(ConfigurationError, match="retries: a sweep is retry-free"):
        await evaluation_sweep.with_options(retries=1, retry_delay_seconds=0)(
            dataset=str(EXAMPLE_DATASET), backend=dataset_backend(tmp_path), results=str(tmp_path / "results")
        )
    assert not (tmp_path / "results").exists() and not (tmp_path / "trials").exists()


async def test_a_bad_rows_per_task_run_is_refused_before_any_trial(tmp_path):
    from prefect_harbor.config import ConfigurationError

    with pytest.raises(ConfigurationError, match="rows_per_task_run: 0 is not a row count; give 1 or more"):
        await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend=dataset_backend(tmp_path), results=str(tmp_path / "results"), rows_per_task_run=0)
    assert not (tmp_path / "results").exists() and not (tmp_path / "trials").exists()
    # The flow run's log says it in one line, as the CLI does: no traceback for the user's mistake.
    async with get_client() as client:
        (run,) = [r for r in await client.read_flow_runs() if r.parameters.get("results") == str(tmp_path / "results")]
        logs = await logs_of(client, run.id)
    assert any("rows_per_task_run: 0 is not a row count" in message for message in logs), logs
    assert not any("Traceback" in message for message in logs), logs


async def test_a_bad_attempts_count_is_refused_before_any_trial(tmp_path):
    from prefect_harbor.config import ConfigurationError

    with pytest.raises(ConfigurationError, match="attempts: 0 is not an attempt count; give 1 or more"):
        await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend=dataset_backend(tmp_path), results=str(tmp_path / "results"), attempts=0)
    assert not (tmp_path / "results").exists() and not (tmp_path / "trials").exists()


async def test_trials_at_once_that_the_hosts_process_budget_cannot_hold_are_refused_before_any_trial(tmp_path):
    from prefect_harbor.config import ConfigurationError
    from prefect_harbor.sandbox.limits import process_budget

    backend = dataset_backend(tmp_path).model_copy(update={"environment": TrialEnvironment(kwargs={"pids_limit": process_budget() // 2})})
    with pytest.raises(ConfigurationError, match=r"environment.kwargs.pids_limit: \d+ processes per trial times 3 trials at once .* lower pids_limit"):
        await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend=backend, results=str(tmp_path / "results"), concurrency=3)
    assert not (tmp_path / "results").exists() and not (tmp_path / "trials").exists()


async def test_an_error_before_the_lanes_start_marks_the_run_failed_and_stops_its_heartbeat(tmp_path, monkeypatch):
    """The run folder says Running from ``begin``: a crash in the prewarm must not leave it saying so, beating on."""
    import asyncio

    import prefect_harbor.flows.run_folder as run_folder
    import prefect_harbor.flows.sweep as sweep

    async def exploding_prewarm(*args, **kwargs):
        raise RuntimeError("prewarm exploded")

    monkeypatch.setattr(sweep, "prewarm_all", exploding_prewarm)
    monkeypatch.setattr(run_folder, "HEARTBEAT_SECONDS", 0.05)
    with pytest.raises(RuntimeError, match="prewarm exploded"):
        await evaluation_sweep(dataset=str(EXAMPLE_DATASET), backend=dataset_backend(tmp_path), results=str(tmp_path / "results"))
    (folder,) = (tmp_path / "results").iterdir()
    assert json.loads((folder / "manifest.json").read_text())["state"] == "Failed"
    beat = (folder / "heartbeat.json").read_bytes()
    await asyncio.sleep(0.5)  # ten beats, had the heartbeat outlived the run
    assert (folder / "heartbeat.json").read_bytes() == beat


async def test_batched_rows_share_task_runs_and_each_keeps_its_own_result(tmp_path):
    from prefect_harbor.flows.reporting import PROGRESS_KEY

    summary = await evaluation_sweep(
        dataset=str(EXAMPLE_DATASET), backend=dataset_backend(tmp_path), results=str(tmp_path / "results"), concurrency=2, rows_per_task_run=2
    )

    table = pq.read_table(summary.results_uri).to_pylist()
    assert {row["task"]: row["reward"] for row in table} == EXPECTED_ORACLE_REWARDS
    assert sorted(row["row_index"] for row in table) == list(range(len(EXPECTED_ORACLE_REWARDS)))
    async with get_client() as client:
        (flow_run_id,) = [r.id for r in await client.read_flow_runs() if r.parameters.get("results") == str(tmp_path / "results")]
        task_runs = [r for r in await task_runs_of(client, flow_run_id) if r.name.startswith("row")]
        progress = (await artifacts_of(client, flow_run_id, PROGRESS_KEY))[-1:]
    # Two lanes pull rows until each task run holds two: 7 rows make 4 task runs (2 + 2 + 2 + 1), never one per row.
    assert sorted(r.name.split(" ")[0] for r in task_runs) == ["rows"] * math.ceil(len(EXPECTED_ORACLE_REWARDS) / 2), [r.name for r in task_runs]
    assert all(r.state.is_completed() for r in task_runs)
    messages = {r.state.message.split(";")[0] for r in task_runs}
    assert "2 rows: 2 success" in messages and messages <= {"2 rows: 2 success", "reward 1", "reward 0"}, messages  # the last holds one row
    assert progress and progress[0].data == 100.0


async def test_a_multi_step_task_runs_its_steps_and_combines_their_rewards(tmp_path):
    """Harbor 0.25's steps/*/: each step's agent run and verifier in one container; the task's strategy (mean) makes the reward."""
    from tasks_factory import write_multi_step_task

    write_multi_step_task(tmp_path / "tasks", "two-steps", {
        "create": ("echo one > /app/notes.txt", "grep -q one /app/notes.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"),
        "extend": ("echo two >> /app/notes.txt", "[ $(wc -l < /app/notes.txt) = 2 ] && echo 0.5 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"),
    })  # fmt: skip
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"id": "steps", "metadata": {"harbor_task_id": "two-steps"}}) + "\n")
    summary = await evaluation_sweep(dataset=str(dataset), backend=dataset_backend(tmp_path, tasks_dir=tmp_path / "tasks"), results=str(tmp_path / "results"))
    (row,) = pq.read_table(summary.results_uri).to_pylist()
    assert (row["status"], row["reward"]) == ("success", 0.75), row["err_message"]


async def test_a_folder_of_terminal_bench_tasks_runs_through_harbors_migration(tmp_path, caplog):
    """task.yaml / solution.sh / run-tests.sh: converted once by Harbor's TerminalBenchMapper into a cache, then run."""
    from tasks_factory import write_terminal_bench_task

    write_terminal_bench_task(tmp_path / "tb", "make-file", solve="echo done > /app/done.txt", check="test -f /app/done.txt")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"id": "tb", "metadata": {"harbor_task_id": "make-file"}}) + "\n")
    summary = await evaluation_sweep(dataset=str(dataset), backend=dataset_backend(tmp_path, tasks_dir=tmp_path / "tb"), results=str(tmp_path / "results"))
    (row,) = pq.read_table(summary.results_uri).to_pylist()
    assert (row["status"], row["reward"], row["task"]) == ("success", 1.0, "make-file"), row["err_message"]
    assert "Converted Terminal-Bench task make-file (task.yaml)" in caplog.text
    assert not (tmp_path / "tb" / "make-file" / "task.toml").exists(), "the user's folder was changed"


async def test_a_two_service_compose_task_scores_with_tests_that_call_its_service_by_name(tmp_path):
    """main and an api service built from its own context: the oracle and the verifier both call it as http://api:8000."""
    from tasks_factory import FETCH, write_api_task

    solve = f'URL=http://api:8000/answer.txt; {FETCH} > /app/answer.txt'
    check = f'URL=http://api:8000/answer.txt; [ "$({FETCH})" = "$(cat /app/answer.txt)" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt'
    task = write_api_task(tmp_path / "tasks", "web-api", test=check)
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"id": "api", "metadata": {"harbor_task_id": "web-api"}}) + "\n")
    summary = await evaluation_sweep(dataset=str(dataset), backend=dataset_backend(tmp_path, tasks_dir=tmp_path / "tasks"), results=str(tmp_path / "results"))
    (row,) = pq.read_table(summary.results_uri).to_pylist()
    assert (row["status"], row["reward"]) == ("success", 1.0), row["err_message"]


async def test_a_single_service_compose_task_runs_with_its_settings(tmp_path):
    """environment, working_dir, extra_hosts, entrypoint and healthcheck of the one service reach the trial's container."""
    from tasks_factory import write_task

    check = (
        '[ "$MODE" = strict ] && [ "$(pwd)" = /srv ] && getent hosts db.internal | grep -q 10.1.2.3 && [ -f /tmp/entrypoint-ran ] '
        "&& echo 1 > /logs/verifier/reward.txt || { env; pwd; cat /etc/hosts; echo 0 > /logs/verifier/reward.txt; }"
    )
    task = write_task(tmp_path / "tasks", "compose-main", test=check)
    (task / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    build:\n      context: ${CONTEXT_DIR}\n    image: ${MAIN_IMAGE_NAME}\n"
        "    command: [sh, -c, sleep infinity]\n    environment: [MODE=strict]\n    working_dir: /srv\n"
        '    extra_hosts: ["db.internal:10.1.2.3"]\n'
        '    entrypoint: ["/bin/sh", "-c", "touch /tmp/entrypoint-ran; exec \\"$$@\\"", "--"]\n'
        "    healthcheck:\n      test: [CMD-SHELL, test -f /tmp/entrypoint-ran]\n"
    )
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"id": "compose", "metadata": {"harbor_task_id": "compose-main"}}) + "\n")
    summary = await evaluation_sweep(dataset=str(dataset), backend=dataset_backend(tmp_path, tasks_dir=tmp_path / "tasks"), results=str(tmp_path / "results"))
    (row,) = pq.read_table(summary.results_uri).to_pylist()
    assert (row["status"], row["reward"]) == ("success", 1.0), row["err_message"]


async def test_an_agent_timeout_multiplier_gives_a_slow_agent_the_time_harbor_run_would(tmp_path):
    """The task allows its agent 2 s; the oracle needs about 4. As `harbor run --agent-timeout-multiplier 4`."""
    task = write_task(tmp_path / "tasks", "slow-agent", solve="sleep 4")
    (task / "task.toml").write_text("[agent]\ntimeout_sec = 2\n[verifier]\ntimeout_sec = 60\n")
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"id": "slow", "metadata": {"harbor_task_id": "slow-agent"}}) + "\n")
    outcomes = {}
    for multiplier in (None, 4.0):
        backend = dataset_backend(tmp_path, tasks_dir=tmp_path / "tasks", agent_timeout_multiplier=multiplier)
        summary = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / f"results-{multiplier}"))
        (row,) = pq.read_table(summary.results_uri).to_pylist()
        outcomes[multiplier] = (row["status"], row["err_category"], row["reward"])
    assert outcomes == {None: ("failure", "timeout", None), 4.0: ("success", None, 1.0)}
