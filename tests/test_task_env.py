"""A task.toml may read only the host variables the backend lists (task_env_passthrough)."""

import pytest
from tasks_factory import write_task

from prefect_harbor.rows.sources import RowRejected
from prefect_harbor.trial.task_env import refuse_unlisted_host_variables

SECTIONS = {
    "[environment.env]": '[environment.env]\nTOKEN = "${AWS_SECRET_ACCESS_KEY}"\n',
    "[solution.env]": '[solution.env]\nTOKEN = "${AWS_SECRET_ACCESS_KEY:-fallback}"\n',
    "[verifier.env]": '[verifier.env]\nTOKEN = "${AWS_SECRET_ACCESS_KEY}"\n',
    "[environment.mcp_servers.tools.headers]": (
        '[[environment.mcp_servers]]\nname = "tools"\nurl = "http://mcp:8000/sse"\n'
        '[environment.mcp_servers.headers]\nAuthorization = "Bearer ${AWS_SECRET_ACCESS_KEY}"\n'
    ),
}


@pytest.mark.parametrize("section", SECTIONS)
def test_a_template_for_an_unlisted_variable_is_refused_naming_it(tmp_path, section):
    task = write_task(tmp_path, "leaky")
    (task / "task.toml").write_text((task / "task.toml").read_text() + SECTIONS[section])
    with pytest.raises(RowRejected) as refused:
        refuse_unlisted_host_variables(task, "leaky", allowed=[])
    assert f"AWS_SECRET_ACCESS_KEY (in {section} " in str(refused.value) and "task_env_passthrough" in str(refused.value)


def test_listed_variables_and_literals_pass(tmp_path):
    task = write_task(tmp_path, "fine")
    (task / "task.toml").write_text((task / "task.toml").read_text() + '[verifier.env]\nTOKEN = "${JUDGE_KEY}"\nMODE = "strict"\n')
    refuse_unlisted_host_variables(task, "fine", allowed=["JUDGE_KEY"])


def test_passed_through_credentials_are_secrets_of_the_run(monkeypatch):
    """A token a task may read (task.toml or compose ${VAR}) is redacted wherever the sweep writes, as the model key is."""
    from paths import EXAMPLE_TASKS

    from prefect_harbor.blocks import HarborBackend
    from prefect_harbor.flows.sweep import run_secrets

    monkeypatch.setenv("GH_TOKEN", "ghp_a_passed_through_token")
    monkeypatch.setenv("LOG_LEVEL", "debug-and-more")
    monkeypatch.setenv("FEATURE_AUTH", "true")
    monkeypatch.setenv("OTHER_SECRET", "never-passed-through")
    backend = HarborBackend(tasks_dir=EXAMPLE_TASKS, task_mode="dataset", agent="oracle", task_env_passthrough=["GH_TOKEN", "LOG_LEVEL", "FEATURE_AUTH", "UNSET_KEY"])
    assert run_secrets(backend, None) == ["ghp_a_passed_through_token"]
