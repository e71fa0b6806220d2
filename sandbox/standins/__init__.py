"""Base images shipped as stand-ins for the ones a closed network cannot pull.

Used only when the real base is not in local storage and cannot be pulled (a user with a
registry gets the real image), after the backend's own ``base_images`` map, and always with
a warning that names what stands in for what.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class StandIn:
    pattern: str  # a regex over the normalized reference (docker.io/library/ubuntu:24.04)
    what: str  # what the warning says the stand-in is
    image: str | None = None  # an existing base to use as it is
    folder: Path | None = None  # or a build context of ours (its Dockerfile is built like a task's)


SHIPPED = (
    StandIn(r"docker\.io/library/ubuntu:.*", "Debian 12 (bookworm), where the Ubuntu package names tasks install resolve", image="debian:bookworm"),
    StandIn(
        r"docker\.io/library/buildpack-deps:.*",
        "Debian 12 with buildpack-deps' compilers, build tools, scm clients and curl (tasks call them without installing them)",
        folder=HERE / "buildpack-deps",
    ),
    StandIn(r"docker\.io/library/python:3[^/]*", "Debian 12's python3 3.11 with pip (no PEP 668 refusal), not the tag's Python version", folder=HERE / "python"),
    StandIn(r"ghcr\.io/laude-institute/t-bench/.*", "Debian 12 with WORKDIR /app, tmux, asciinema and pytest, as the t-bench images had", folder=HERE / "t-bench"),
)


def shipped_stand_in(normalized: str) -> StandIn | None:
    return next((stand_in for stand_in in SHIPPED if re.fullmatch(stand_in.pattern, normalized)), None)
