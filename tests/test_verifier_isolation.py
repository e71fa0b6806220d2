"""verifier_isolation = "separate" (issue 28): a shared-mode task's private copy is rewritten so
Harbor verifies it in a fresh container of its image, with its workdir (or the listed paths) as artifacts."""

import pytest
from harbor.models.task.config import TaskConfig
from tasks_factory import write_separate_verifier_task, write_task

from prefect_harbor.rows.sources import RowRejected
from prefect_harbor.trial.verifier_isolation import isolate_verifier


def config(task) -> TaskConfig:
    return TaskConfig.model_validate_toml((task / "task.toml").read_text())


def test_a_shared_task_gets_a_separate_verifier_with_its_workdir_as_artifact(tmp_path):
    task = write_task(tmp_path, "t")  # its Dockerfile ends with WORKDIR /app
    assert isolate_verifier(task, "t", []) == ["/app"]
    assert (config(task).verifier.environment_mode, config(task).artifacts) == ("separate", ["/app"])


def test_the_listed_paths_replace_the_workdir(tmp_path):
    task = write_task(tmp_path, "t")
    assert isolate_verifier(task, "t", ["/srv/out", "/app/result.txt"]) == ["/srv/out", "/app/result.txt"]
    assert config(task).artifacts == ["/srv/out", "/app/result.txt"]


def test_a_task_verified_separately_already_is_left_as_it_is(tmp_path):
    task = write_separate_verifier_task(tmp_path, "s", "CORRECT")
    before = (task / "task.toml").read_text()
    assert isolate_verifier(task, "s", []) == [] and (task / "task.toml").read_text() == before


def test_a_task_with_no_workdir_and_no_listed_paths_is_refused_naming_the_fix(tmp_path):
    task = write_task(tmp_path, "t")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    with pytest.raises(RowRejected, match="names none .*list the paths to copy in the backend's verifier_artifacts"):
        isolate_verifier(task, "t", [])
