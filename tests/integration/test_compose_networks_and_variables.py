"""A compose task as compose reads it, through the real sweep: a named network every service joins
(an alias of a service included), and ``${VAR}`` from the backend's task_env_passthrough only."""

from __future__ import annotations

import json
import secrets

import pyarrow.parquet as pq
import pytest
from tasks_factory import API_FILES, FETCH, write_task

from prefect_harbor.blocks import HarborBackend
from prefect_harbor.flows import evaluation_sweep

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

COMPOSE = """services:
  main:
    environment:
      GH_TOKEN: ${GH_TOKEN}
      API_URL: http://${API_HOST:-inventory}:8000/answer.txt
      LEAKED: ${PREFECT_HARBOR_NOT_PASSED:-nothing}
      PRICE: cost $$5
    networks: [backend]
    depends_on:
      api: {condition: service_healthy}
  api:
    build: ./api
    command: python3 -m http.server 8000 --directory /srv
    networks:
      backend:
        aliases: [inventory]
    healthcheck:
      test: [CMD, python3, -c, "import urllib.request; urllib.request.urlopen('http://localhost:8000/answer.txt', timeout=2)"]
      interval: 1s
      retries: 20
networks:
  backend:
    driver: bridge
"""


async def test_a_named_network_and_passed_through_variables_reach_the_trial_and_the_token_is_redacted(tmp_path, monkeypatch):
    token = f"ghp_{secrets.token_hex(12)}"
    monkeypatch.setenv("GH_TOKEN", token)
    monkeypatch.setenv("PREFECT_HARBOR_NOT_PASSED", "a-host-value-no-task-may-read")
    check = (
        f'echo "token=$GH_TOKEN"; URL=$API_URL; [ "${{GH_TOKEN:0:4}}" = ghp_ ] && [ "$LEAKED" = nothing ] && [ "$PRICE" = "cost \\$5" ] '
        f'&& [ "$({FETCH})" = 42 ] && echo 1 > /logs/verifier/reward.txt || {{ env; echo 0 > /logs/verifier/reward.txt; }}'
    )
    task = write_task(tmp_path / "tasks", "networked", test=check)
    for relative, text in {**API_FILES, "docker-compose.yaml": COMPOSE}.items():
        (task / "environment" / relative).parent.mkdir(parents=True, exist_ok=True)
        (task / "environment" / relative).write_text(text)
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text(json.dumps({"id": "networked", "metadata": {"harbor_task_id": "networked"}}) + "\n")
    backend = HarborBackend(
        tasks_dir=tmp_path / "tasks", task_mode="dataset", agent="oracle", trials_dir=str(tmp_path / "trials"), task_env_passthrough=["GH_TOKEN"]
    )
    summary = await evaluation_sweep(dataset=str(dataset), backend=backend, results=str(tmp_path / "results"))
    (row,) = pq.read_table(summary.results_uri).to_pylist()
    assert (row["status"], row["reward"]) == ("success", 1.0), row["err_message"]
    written = b"".join(path.read_bytes() for path in (tmp_path / "results").rglob("*") if path.is_file())
    assert b"token=[REDACTED]" in written, "the verifier's output was not archived: nothing was tested"
    assert token.encode() not in written
