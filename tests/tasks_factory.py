"""Small Harbor tasks written by tests, for behaviours the bundled examples do not have."""

import shutil
import subprocess
from pathlib import Path


#: A base image every test machine has (scripts/dev.sh bootstraps it from Debian's mirror).
BASE_IMAGE = "prefect-harbor.local/library/debian:bookworm-slim"
#: The image every test task shares (one build, cached): Debian with what the checks use.
BASE_DOCKERFILE = (
    "FROM debian:bookworm-slim\n"
    "RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends tmux procps python3 >/dev/null "
    "&& rm -rf /var/lib/apt/lists/*\n"
    "WORKDIR /app\n"
)


def write_task(root: Path, name: str, solve: str = "true", test: str = "echo 1 > /logs/verifier/reward.txt") -> Path:
    """A task whose oracle runs ``solve`` and whose verifier runs ``test`` (bash)."""
    task = root / name
    for folder in ("environment", "solution", "tests"):
        (task / folder).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text('[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n')
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "environment" / "Dockerfile").write_text(BASE_DOCKERFILE)
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    (task / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test}\n")
    return task


def git_task_repo(repo: Path, task: Path, path_in_repo: str = "tasks/hello") -> tuple[str, str]:
    """A local git repository holding ``task`` at ``path_in_repo``: (its file:// URL, the commit)."""
    shutil.copytree(task, repo / path_in_repo)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "task"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return f"file://{repo}", commit
