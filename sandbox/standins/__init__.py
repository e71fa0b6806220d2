"""Base images shipped as stand-ins for the ones a closed network cannot pull.

Used only when the real base is not in local storage and cannot be pulled (a user with a
registry gets the real image), after the backend's own ``base_images`` map, and always with
a warning that names what stands in for what. Each follows its tag as far as Debian's mirror
and PyPI allow: ``python:3.X`` gets the Debian suite whose python3 is 3.X (the nearest one
otherwise, said in the warning), ``ubuntu:23.04`` and later get the ``ubuntu`` user those
images have, ``ghcr.io/astral-sh/uv:X`` gets uv X's own binaries (:mod:`.uv`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prefect_harbor.sandbox.standins.uv import uv_context

HERE = Path(__file__).parent

#: Debian suites by the minor version of their python3 (what ``python:3.X`` stand-ins are built on).
PYTHON_SUITES = {9: ("bullseye", 11), 11: ("bookworm", 12), 13: ("trixie", 13)}
#: Ubuntu releases before 23.04 have no ``ubuntu`` user (uid 1000): a task may create its own with that uid.
_UBUNTU_WITHOUT_USER = re.compile(r"(1\d|2[0-2])\.\d\d.*|(trusty|xenial|bionic|focal|jammy|kinetic)\b.*")


@dataclass(frozen=True)
class StandIn:
    what: str  # what the warning says the stand-in is
    image: str | None = None  # an existing base to use as it is
    folder: Path | None = None  # or a build context of ours (its Dockerfile is built like a task's)
    build_args: dict[str, str] = field(default_factory=dict)  # the global ARG defaults its Dockerfile is built with
    #: or a build context made on first use in the given cache folder: returns (its folder, what it holds)
    make: Callable[[Path], tuple[Path, str]] | None = None


def _ubuntu(match: re.Match[str]) -> StandIn:
    if _UBUNTU_WITHOUT_USER.fullmatch(match["tag"]):
        return StandIn("Debian 12 (bookworm), where the Ubuntu package names tasks install resolve", image="debian:bookworm")
    return StandIn(
        "Debian 12 (bookworm) with the `ubuntu` user (uid 1000) Ubuntu's images have since 23.04, where the Ubuntu package names tasks install resolve",
        folder=HERE / "ubuntu",
    )


def _python(match: re.Match[str]) -> StandIn:
    """The Debian suite whose python3 is the tag's minor version, else the nearest (ties go to the newer:
    code written for 3.12 runs on 3.13, not on 3.11)."""
    wanted = int(match["minor"]) if match["minor"] else max(PYTHON_SUITES)
    minor = min(PYTHON_SUITES, key=lambda m: (abs(m - wanted), -m))
    suite, release = PYTHON_SUITES[minor]
    what = f"Debian {release} ({suite})'s python3 3.{minor} with pip (no PEP 668 refusal)"
    if minor != wanted:
        what += f", NOT the tag's Python 3.{wanted}: no Debian suite has it, 3.{minor} is the nearest"
    tagged = re.search(r"-(buster|bullseye|bookworm|trixie)\b", match["rest"])
    if tagged and tagged[1] != suite:
        what += f", on Debian {suite} rather than the tag's {tagged[1]}"
    return StandIn(what, folder=HERE / "python", build_args={"SUITE": suite})


def _uv(match: re.Match[str]) -> StandIn:
    return StandIn("uv's /uv and /uvx", make=functools.partial(uv_context, match["version"]))


_FAMILIES: tuple[tuple[str, Callable[[re.Match[str]], StandIn]], ...] = (
    (r"docker\.io/library/ubuntu:(?P<tag>.*)", _ubuntu),
    (
        r"docker\.io/library/buildpack-deps:.*",
        lambda _: StandIn(
            "Debian 12 with buildpack-deps' compilers, build tools, scm clients and curl (tasks call them without installing them)",
            folder=HERE / "buildpack-deps",
        ),
    ),
    (r"docker\.io/library/python:3(?:\.(?P<minor>\d+))?(?P<rest>[^/]*)", _python),
    (
        r"ghcr\.io/laude-institute/t-bench/.*",
        lambda _: StandIn("Debian 12 with WORKDIR /app, tmux, asciinema and pytest, as the t-bench images had", folder=HERE / "t-bench"),
    ),
    # The distroless release images (/uv and /uvx alone), as `COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/` uses them.
    (r"ghcr\.io/astral-sh/uv:(?:(?P<version>\d+\.\d+(?:\.\d+)?)|latest)", _uv),
)


def shipped_stand_in(normalized: str) -> StandIn | None:
    """The stand-in this project ships for a normalized reference (``docker.io/library/ubuntu:24.04``), if any."""
    for pattern, stand_in in _FAMILIES:
        if match := re.fullmatch(pattern, normalized):
            return stand_in(match)
    return None
