"""Configuration errors name the field and the fix, before any trial."""

import pytest
from pydantic import ValidationError

from prefect_harbor.config import SweepConfig, TrialEnvironment
from prefect_harbor.sandbox import IMPORT_PATH

from paths import EXAMPLE_TASKS


def error_text(**kwargs) -> str:
    with pytest.raises(ValidationError) as caught:
        SweepConfig(**kwargs)
    return str(caught.value)


def test_missing_tasks_dir(tmp_path):
    assert "tasks_dir:" in error_text(tasks_dir=tmp_path / "nope")


def test_template_mode_needs_a_task_and_dataset_mode_a_root():
    assert "template mode needs one Harbor task" in error_text(tasks_dir=EXAMPLE_TASKS, task_mode="template")
    assert "use --mode template" in error_text(tasks_dir=EXAMPLE_TASKS / "reward-txt", task_mode="dataset")


def test_a_root_without_tasks_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    assert "holds no task directories" in error_text(tasks_dir=tmp_path)


def test_unknown_native_agent_lists_the_registered_ones():
    text = error_text(tasks_dir=EXAMPLE_TASKS, agent="orakel")
    assert "unknown native agent 'orakel'" in text and "terminus-2" in text


def test_defaults_run_in_the_local_sandbox():
    config = SweepConfig(tasks_dir=EXAMPLE_TASKS)
    assert config.environment.import_path == IMPORT_PATH
    assert config.task_mode == "dataset" and config.agent == "oracle"


def test_choosing_an_environment_type_replaces_the_sandbox():
    assert TrialEnvironment(type="docker").import_path is None
    with pytest.raises(ValidationError, match="exactly one"):
        TrialEnvironment(import_path=None)
