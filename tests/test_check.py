"""`prefect-harbor check` refuses what the sweep would refuse, per task, on real task folders."""

import json
from pathlib import Path

import pytest
from tasks_factory import BASE_IMAGE, write_task
from typer.testing import CliRunner

from prefect_harbor.cli.commands import app


def check(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["check", *args])
    return result.exit_code, result.output


def dataset_of(path: Path, *task_ids: str) -> str:
    path.write_text("".join(json.dumps({"id": f"row-{n}", "metadata": {"harbor_task_id": t}}) + "\n" for n, t in enumerate(task_ids)))
    return str(path)


@pytest.fixture
def tasks(tmp_path: Path) -> Path:
    """A dataset-mode folder holding one good task (the configuration needs a reward source)."""
    write_task(tmp_path / "tasks", "good")
    return tmp_path / "tasks"


def test_check_passes_a_good_task(tasks):
    code, output = check("--tasks-dir", str(tasks))
    assert code == 0, output
    assert "good" in output and "tests/test.sh" in output and "refused" not in output


def test_check_refuses_an_id_that_escapes_tasks_dir(tasks, tmp_path):
    write_task(tmp_path / "outside", "reward-txt")  # a real task, but not under tasks_dir
    dataset = dataset_of(tmp_path / "rows.jsonl", "good", "../outside/reward-txt")
    code, output = check("--tasks-dir", str(tasks), "--dataset", dataset)
    assert code == 1, output
    assert "refused ../outside/reward-txt: unknown harbor task id '../outside/reward-txt'" in output


def test_check_refuses_an_unparsable_task_toml(tasks):
    (write_task(tasks, "bad-toml") / "task.toml").write_text("[agent\ntimeout_sec = 120\n")
    code, output = check("--tasks-dir", str(tasks))
    assert code == 1, output
    assert "refused bad-toml: task 'bad-toml': its task.toml cannot be loaded (Expected ']'" in output


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_check_refuses_a_compose_task_it_cannot_honour_naming_the_key(tasks):
    """main merges into the container and services run beside it; a key the sandbox cannot honour
    is refused, and a service image not in local storage is named (the sweep will try to pull it)."""
    write_task(tasks, "one-service")
    (tasks / "one-service" / "environment" / "docker-compose.yaml").write_text("services:\n  main:\n    build: .\n    working_dir: /srv\n")
    environment = write_task(tasks, "two-services") / "environment"
    (environment / "docker-compose.yaml").write_text(f"services:\n  main:\n    build: .\n  db:\n    image: {BASE_IMAGE}\n")
    environment = write_task(tasks, "unknown-image") / "environment"
    (environment / "docker-compose.yaml").write_text("services:\n  main:\n    build: .\n  db:\n    image: postgres:16\n")
    environment = write_task(tasks, "privileged") / "environment"
    (environment / "docker-compose.yaml").write_text("services:\n  main:\n    build: .\n  db:\n    image: x\n    privileged: true\n")
    code, output = check("--tasks-dir", str(tasks))
    assert code == 1, output
    assert "check pulls nothing, the sweep will try to: base image 'postgres:16' is not in local storage" in output
    assert "refused privileged:" in output and "services.db.privileged cannot be honoured" in output
    assert "refused one-service" not in output and "refused two-services" not in output and "refused unknown-image" not in output


def test_check_refuses_a_symlinked_task(tasks, tmp_path):
    solve = write_task(tasks, "linked") / "solution" / "solve.sh"
    solve.unlink()
    solve.symlink_to("/etc/passwd")
    (tasks / "elsewhere").symlink_to(write_task(tmp_path / "outside", "elsewhere"))  # a task folder that is a link out
    code, output = check("--tasks-dir", str(tasks))
    assert code == 1, output
    assert "refused linked: task 'linked' contains a symlink (solution/solve.sh)" in output
    assert "refused elsewhere: unknown harbor task id 'elsewhere'" in output


@pytest.mark.parametrize(
    ("dockerfile", "reason"),
    [
        ("FROM\nRUN true\n", "line 1: cannot read 'FROM'"),
        ("ARG BASE\nFROM ${BASE}\n", "names no image once its ARG defaults are substituted"),
        (None, "has no environment definition"),
    ],
    ids=["unreadable-from", "empty-from", "missing"],
)
def test_check_refuses_a_bad_dockerfile(tasks, dockerfile, reason):
    path = write_task(tasks, "bad-image") / "environment" / "Dockerfile"
    if dockerfile is None:
        path.unlink()
    else:
        path.write_text(dockerfile)
    code, output = check("--tasks-dir", str(tasks))
    assert code == 1, output
    assert "refused bad-image:" in output and reason in output


def test_check_notes_a_base_image_not_in_local_storage(tasks):
    """check pulls nothing: a base it cannot find locally is a note (the sweep will try a pull), not a refusal."""
    (write_task(tasks, "remote-base") / "environment" / "Dockerfile").write_text("FROM registry.invalid/none:1\n")
    code, output = check("--tasks-dir", str(tasks))
    assert code == 0, output
    assert "note remote-base: check pulls nothing" in output and "registry.invalid/none:1" in output


def test_check_code_dir_alone_scans_for_v02_apis(tmp_path):
    (tmp_path / "rollout.py").write_text("backend = HarborBackendV2(task_dir='t')\n")
    code, output = check("--code-dir", str(tmp_path))
    assert code == 1, output
    assert f"{tmp_path / 'rollout.py'}:1:" in output and "2 use(s) of removed v0.2 APIs" in output
    assert "configuration OK" not in output


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_check_says_per_task_whether_its_image_is_built_pulled_or_local(tasks):
    """A Terminal-Bench 2.0 task names a prebuilt image and ships its Dockerfile: the sweep pulls it, or builds the Dockerfile."""
    for name, image in [("tb2-shaped", "registry.invalid/alexgshaw/tb2-shaped:20251031"), ("local-image", BASE_IMAGE)]:
        (write_task(tasks, name) / "task.toml").write_text(f'[environment]\ndocker_image = "{image}"\n')
    code, output = check("--tasks-dir", str(tasks))
    assert code == 0, output
    assert "image good: builds environment/Dockerfile\n" in output
    assert (
        "image tb2-shaped: pulls docker_image registry.invalid/alexgshaw/tb2-shaped:20251031, "
        "or builds its environment/Dockerfile if it cannot be pulled"
    ) in output
    assert f"image local-image: uses docker_image {BASE_IMAGE} (in local storage)" in output
    code, forced = check("--tasks-dir", str(tasks), "--force-build")
    assert code == 0 and forced.count("builds environment/Dockerfile (force_build)") == 2, forced


@pytest.mark.integration  # it starts podman (the prefect-harbor network, an image)
def test_check_names_separate_verifiers_and_refuses_one_it_cannot_build(tasks):
    """A separate verifier's own image (tests/Dockerfile) is checked with the task's; one that brings
    its tests needs no tests/test.sh in the task folder, as in Harbor."""
    from tasks_factory import write_separate_verifier_task

    write_separate_verifier_task(tasks, "separate", word="CORRECT")
    (write_separate_verifier_task(tasks, "image-only", word="CORRECT") / "tests" / "test.sh").unlink()
    (write_separate_verifier_task(tasks, "bad-verifier", word="CORRECT") / "tests" / "Dockerfile").write_text("FROM\nCOPY . /tests/\n")
    result = CliRunner().invoke(app, ["check", "--tasks-dir", str(tasks)], env={"COLUMNS": "300"})
    code, output = result.exit_code, result.output
    assert code == 1, output
    assert "tests/test.sh, separate verifier: built from tests/" in output
    assert "the verifier image's own /tests/test.sh, separate verifier: built from tests/" in output and "refused image-only" not in output
    assert "refused bad-verifier:" in output and "tests/Dockerfile" in output and "line 1: cannot read 'FROM'" in output
    assert "refused separate" not in output


def test_a_failed_builds_note_names_its_stand_ins_and_blames_their_archive_only_for_missing_packages():
    from prefect_harbor.sandbox.images import stand_in_note

    stood_in = ["Base image 'ubuntu:24.04' is stood in by 'prefect-harbor.local/ubuntu:24.04', Debian 12 …"]
    missing = b"E: Version '2023.20240207-1' for 'texlive-latex-base' was not found\n"
    assert stand_in_note(missing, []) == "", "no stand-in, nothing to add"
    note = stand_in_note(missing, stood_in)
    assert "'ubuntu:24.04' is stood in by" in note and "Version '2023.20240207-1' for 'texlive-latex-base' was not found" in note
    assert "the stand-in's limit" in note
    assert "limit" not in stand_in_note(b"error: exit status 2\n", stood_in), "a build's own failure is not blamed on the stand-in"
