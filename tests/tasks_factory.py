"""Small Harbor tasks written by tests, for behaviours the bundled examples do not have."""

from pathlib import Path


def write_task(root: Path, name: str, solve: str = "true", test: str = "echo 1 > /logs/verifier/reward.txt") -> Path:
    """A task whose oracle runs ``solve`` and whose verifier runs ``test`` (bash)."""
    task = root / name
    for folder in ("environment", "solution", "tests"):
        (task / folder).mkdir(parents=True, exist_ok=True)
    (task / "task.toml").write_text('[agent]\ntimeout_sec = 120\n[verifier]\ntimeout_sec = 60\n')
    (task / "instruction.md").write_text(f"Task {name}.\n")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nWORKDIR /app\n")
    (task / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    (task / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test}\n")
    return task
