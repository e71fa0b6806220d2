"""Base images shipped as stand-ins for the ones a closed network cannot pull.

Used only when the real base is not in local storage and cannot be pulled (a user with a
registry gets the real image), after the backend's own ``base_images`` map, and always with
a warning that names what stands in for what. Each follows its tag as far as Debian's mirror
and PyPI allow: ``python:3.X[-slim][-suite]`` gets CPython 3.X compiled from Debian's source
package into ``/usr/local`` on that suite, as the official image is made (the nearest minor
Debian has the source of otherwise, said in the warning), ``ubuntu:23.04`` and later get the ``ubuntu`` user those
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

#: Where Debian's archive carries CPython's source, by minor version: the suite whose source
#: package ``python3.X`` a ``python:3.X`` stand-in is compiled from.
PYTHON_SOURCES = {9: "bullseye", 11: "bookworm", 13: "trixie", 14: "forky"}
#: Debian's release numbers, for the warnings; the suite the official tags without one name today.
DEBIAN_RELEASES = {"buster": 10, "bullseye": 11, "bookworm": 12, "trixie": 13}
DEFAULT_PYTHON_SUITE = "trixie"
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
    """CPython 3.X compiled from Debian's source package into ``/usr/local`` on the tag's suite,
    as the official image is built; the nearest minor Debian has the source of when it lacks
    3.X (ties go to the newer: code written for 3.12 runs on 3.13, not on 3.11)."""
    wanted = int(match["minor"]) if match["minor"] else max(PYTHON_SOURCES)
    minor = min(PYTHON_SOURCES, key=lambda m: (abs(m - wanted), -m))
    rest = match["rest"]
    tagged = re.search(r"-(buster|bullseye|bookworm|trixie)\b", rest)
    suite = tagged[1] if tagged else DEFAULT_PYTHON_SUITE
    slim = "-slim" in rest or "-alpine" in rest
    what = (
        f"CPython 3.{minor} compiled from Debian's source package python3.{minor} into /usr/local on Debian "
        f"{DEBIAN_RELEASES[suite]} ({suite})'s userland, pip from ensurepip"
    )
    what += ", no compiler (slim)" if slim else ", with gcc, g++, make and the headers CPython builds with (fewer tools than buildpack-deps)"
    what += "; built without the official image's profile-guided optimisation (slower)"
    if minor != wanted:
        what += f"; NOT the tag's Python 3.{wanted}: Debian's archive has no source of it, 3.{minor} is the nearest"
    if "-alpine" in rest:
        what += "; Debian, not Alpine (glibc and apt, not musl and apk)"
    if "-windowsservercore" in rest or "-nanoserver" in rest:
        what += "; Linux, not Windows"
    build_args = {"SUITE": suite, "SOURCE_SUITE": PYTHON_SOURCES[minor], "PYTHON_MINOR": str(minor), "SLIM": "1" if slim else "0"}
    return StandIn(what, folder=HERE / "python", build_args=build_args)


#: The old Terminal-Bench bases by name: what each stand-in holds, and its build context.
_T_BENCH = {
    "python-3-13": ("the python:3.13-slim-bookworm stand-in (CPython 3.13 on Debian 12) with tmux, asciinema, pytest and WORKDIR /app", "t-bench-python"),
    "ubuntu-24-04": ("the ubuntu:24.04 stand-in with tmux, asciinema, python3, pip, pytest and WORKDIR /app", "t-bench-ubuntu"),
    "deveval": (
        "Debian 12 with DevEval's toolchains (pytest and pytest-cov, gcc, g++, make, cmake, Java with Maven, Node.js with npm, git), "
        "tmux, asciinema and WORKDIR /app",
        "t-bench-deveval",
    ),
}


def _t_bench(match: re.Match[str]) -> StandIn:
    unknown = (f"the ubuntu-24-04 one's stand-in, as the base most t-bench images have (no stand-in of its own for {match['name']!r})", "t-bench-ubuntu")
    what, folder = _T_BENCH.get(match["name"], unknown)
    return StandIn(what, folder=HERE / folder)


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
    (r"ghcr\.io/laude-institute/t-bench/(?P<name>[^:]+)(?::.*)?", _t_bench),
    # The distroless release images (/uv and /uvx alone), as `COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/` uses them.
    (r"ghcr\.io/astral-sh/uv:(?:(?P<version>\d+\.\d+(?:\.\d+)?)|latest)", _uv),
)


def shipped_stand_in(normalized: str) -> StandIn | None:
    """The stand-in this project ships for a normalized reference (``docker.io/library/ubuntu:24.04``), if any."""
    for pattern, stand_in in _FAMILIES:
        if match := re.fullmatch(pattern, normalized):
            return stand_in(match)
    return None
