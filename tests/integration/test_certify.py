"""Certifying tasks with real trials on a real server: the oracle's and a do-nothing agent's
attempts judged per task, kept by content digest, and a sweep that runs only certified content."""

import json

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect_reads import artifacts_of
from tasks_factory import write_task

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.certification import task_digest
from prefect_harbor.flows import certify_tasks, evaluation_sweep
from prefect_harbor.scoring import scoring_of

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

#: Rewarded only when the solution ran: an agent doing nothing gets 0.
SOUND_TEST = "[ -f /app/solved ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"


def table_of(summary) -> dict[str, dict]:
    return {row["row_id"]: row for row in pq.read_table(summary.results_uri.removeprefix("file://")).to_pylist()}


async def test_certify_judges_each_task_and_a_certified_only_sweep_runs_only_certified_content(tmp_path):
    tasks, results = tmp_path / "tasks", tmp_path / "results"
    sound = write_task(tasks, "sound", solve="touch /app/solved", test=SOUND_TEST)
    write_task(tasks, "trivial")  # its verifier rewards whatever the agent did
    write_task(tasks, "broken", solve="true", test=SOUND_TEST)  # its reference solution solves nothing

    state = await certify_tasks(tasks_dir=str(tasks), runs=1, results=str(results), return_state=True)
    certifications = {c.task: c for c in await state.aresult()}

    assert {name: c.verdict for name, c in certifications.items()} == {"broken": "broken", "sound": "certified", "trivial": "trivial"}
    assert (certifications["sound"].oracle.rewards, certifications["sound"].nop.rewards) == ([1.0], [0.0])
    assert certifications["trivial"].nop.passed == 1 and certifications["broken"].flake_rate == 1.0
    assert certifications["sound"].digest == task_digest(sound)
    kept = json.loads((results / "certifications" / f"{task_digest(sound).removeprefix('sha256:')}.json").read_text())
    assert kept["verdict"] == "certified" and len(kept["runs"]) == 2, "kept by the task's content digest, naming the two sweeps"
    (report,) = (results / "certifications" / "reports").glob("*.json")
    assert sorted(row["task"] for row in json.loads(report.read_text())) == ["broken", "sound", "trivial"]
    async with get_client() as client:
        (artifact,) = await artifacts_of(client, state.state_details.flow_run_id, "certification")
    assert "1 of 3 task(s) certified" in artifact.description and "trivial" in str(artifact.data)

    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"id": name, "metadata": {"harbor_task_id": name}}) + "\n" for name in ("sound", "trivial", "broken")))
    backend = HarborBackend(tasks_dir=tasks, task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), certified_tasks_only=True)
    rows = table_of(await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(results)))

    assert (rows["sound"]["reward"], rows["sound"]["certification"].split(" ", 1)[0]) == (1.0, "certified"), "a certified task runs, and its rows say so"
    for name, verdict in (("trivial", "trivial"), ("broken", "broken")):
        assert scoring_of(rows[name]) == ("not_scored", "uncertified"), rows[name]
        assert rows[name]["total_sec"] is None and f"task {name} is not certified: its certification says {verdict}" in rows[name]["err_message"]

    (sound / "instruction.md").write_text("Task sound, changed after it was certified.\n")
    rows = table_of(await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(results)))
    assert scoring_of(rows["sound"]) == ("not_scored", "uncertified") and rows["sound"]["certification"] is None
    assert "was never certified" in rows["sound"]["err_message"], "a changed task is new content, with no certification"
