"""The fidelity corpus's shape (benchmarks/fidelity/): cheap checks, no trial runs.

The corpus itself is swept by ``benchmarks/fidelity.py``, a benchmark, not a test; these
checks keep it honest: every folder is a runnable task with a reference solution and a reward
source, the manifest lists exactly the folders, and the kinds issues 16 and 27 ask for are all there.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib

import pytest
import yaml
from paths import REPO

CORPUS = REPO / "benchmarks" / "fidelity"
REQUIRED_KINDS = {
    "apt-only", "apt+pip", "copy-folder", "multi-stage", "compose-single-service", "compose-two-services",
    "entrypoint", "multi-step", "terminal-bench", "python-3.13-slim", "ubuntu-24.04", "non-root-user",
    "verifier-pip-pytest", "multi-key-reward",
    # issue 27: Terminal-Bench 2.0's prebuilt images, WORKDIR, COPY --from an image, stand-ins that match their tags,
    # separate verifiers with artifacts, compose networks and variables
    "prebuilt-image-fallback", "workdir-last", "copy-from-image", "python-version-matches-tag", "ubuntu-user",
    "separate-verifier", "artifacts", "compose-named-network", "compose-variables",
    # issue 40: a verifier that writes into /tests; allowlist networking, and a phase's own network_mode
    "verifier-writes-tests", "allowlist-network", "phase-network-mode",
}  # fmt: skip


def _benchmark():
    spec = importlib.util.spec_from_file_location("fidelity_benchmark", REPO / "benchmarks" / "fidelity.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


fidelity = _benchmark()
TASKS = fidelity.load_corpus(CORPUS)
FOLDERS = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())


def test_the_manifest_lists_exactly_the_task_folders():
    assert sorted(t.name for t in TASKS) == FOLDERS


def test_the_corpus_is_big_enough_and_covers_every_required_kind():
    assert len(TASKS) >= 25
    assert REQUIRED_KINDS <= {kind for task in TASKS for kind in task.kinds}


def test_internet_bound_tasks_are_few_and_marked():
    assert 0 < sum(t.needs_internet for t in TASKS) <= 3


@pytest.mark.parametrize("name", FOLDERS)
def test_every_task_has_a_config_an_instruction_a_solution_and_a_verifier(name: str):
    task = CORPUS / name
    if (task / "task.yaml").is_file():  # Terminal-Bench's format
        config = yaml.safe_load((task / "task.yaml").read_text())
        assert config["instruction"].strip()
        assert (task / "solution.sh").is_file() and (task / "run-tests.sh").is_file()
        assert (task / "Dockerfile").is_file()
        return
    config = tomllib.loads((task / "task.toml").read_text())
    assert (task / "environment" / "Dockerfile").is_file() or (task / "environment" / "docker-compose.yaml").is_file()
    if config.get("verifier", {}).get("environment_mode") == "separate":
        assert config.get("artifacts"), "a separate verifier sees only the declared artifacts: declare them"
    if steps := config.get("steps"):
        for step in steps:
            folder = task / "steps" / step["name"]
            assert (folder / "instruction.md").is_file() and (folder / "tests" / "test.sh").is_file()
            assert (folder / "solution" / "solve.sh").is_file() or (task / "solution" / "solve.sh").is_file()
    else:
        assert (task / "instruction.md").read_text().strip()
        assert (task / "tests" / "test.sh").is_file() and (task / "solution" / "solve.sh").is_file()


@pytest.mark.parametrize("name", FOLDERS)
def test_no_task_uses_a_symlink_or_a_non_executable_script(name: str):
    """The sweep refuses tasks with symlinks; Harbor runs scripts with bash, but authors mark them executable."""
    for path in (CORPUS / name).rglob("*"):
        assert not path.is_symlink(), path
        if path.suffix == ".sh":
            assert path.stat().st_mode & 0o111, f"{path} is not executable"


def test_the_report_counts_internet_bound_tasks_apart_and_ends_with_the_fidelity_line():
    task = fidelity.CorpusTask
    outcomes = [
        fidelity.Outcome(task("a", ()), "success", 1.0, {"reward": 1.0}),
        fidelity.Outcome(task("b", ()), "success", 0.0, {"reward": 0.0}),
        fidelity.Outcome(task("c", (), waits_for="multi-service compose"), "failure", None, category="validation_error", message="2 services\nmore"),
        fidelity.Outcome(task("d", (), needs_internet=True), "success", 0.0, {"reward": 0.0}),
    ]
    lines = fidelity.report(outcomes)
    assert lines[-1] == "fidelity: 1/3 scored 1.0"
    assert "b: success, scored 0 (reward=0)" in lines
    assert "c: failure [validation_error] 2 services; waits for multi-service compose" in lines
    assert any(line.startswith("needs the internet, counted apart (0/1") for line in lines)


def test_tasks_are_swept_once_per_reward_key_default_first():
    tasks = [fidelity.CorpusTask("x", (), reward_key="mean(a, b)"), fidelity.CorpusTask("y", ())]
    assert list(fidelity.by_reward_key(tasks)) == ["reward", "mean(a, b)"]
