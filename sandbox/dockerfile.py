"""Reading and rewriting a task's Dockerfile text before podman builds it.

Two rewrites, each because the engine would otherwise build something other than what
the task's author meant:

* ``FROM`` lines are pinned to the local image each base resolved to (a bootstrapped base,
  or a stand-in the user mapped), so the build never asks a registry for them.
* Heredocs (``RUN <<EOF``, ``COPY <<EOF /path``) are lowered to plain instructions,
  because the buildah in Debian 12 (1.28) predates heredoc support: the body is carried
  base64-encoded and decoded in the build container (``base64`` from coreutils/busybox).
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

_FROM = re.compile(r"^\s*FROM\s+(?P<args>(?:--\S+\s+)*)(?P<image>\S+)(?:\s+AS\s+(?P<stage>\S+))?\s*$", re.IGNORECASE)
_ARG = re.compile(r"^\s*ARG\s+(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:=(?P<value>\S*))?\s*$", re.IGNORECASE)
_HEREDOC = re.compile(r"^(?P<head>\s*(?P<op>RUN|COPY|ADD)\s+(?:--\S+\s+)*)<<(?P<dash>-?)(?P<quote>[\"']?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)(?P=quote)(?P<rest>.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class FromLine:
    index: int  # first physical line of the instruction
    end: int  # last physical line (continuations included)
    image: str  # the reference as written, global ARG defaults substituted
    stage: str | None
    platform: str | None


def logical_lines(dockerfile: str) -> list[tuple[int, int, str]]:
    """(first line, last line, joined text) of each instruction, continuations folded, comments dropped."""
    out: list[tuple[int, int, str]] = []
    start, acc = None, ""
    for index, raw in enumerate(dockerfile.splitlines()):
        text = raw.rstrip()
        if start is None and (not text.strip() or text.lstrip().startswith("#")):
            continue
        if start is None:
            start = index
        if text.endswith("\\"):
            acc += text[:-1] + " "
            continue
        out.append((start, index, acc + text))
        start, acc = None, ""
    if start is not None:
        out.append((start, len(dockerfile.splitlines()) - 1, acc))
    return out


def parse_from_lines(dockerfile: str) -> list[FromLine]:
    """The ``FROM`` lines, with global ``ARG`` defaults substituted as Docker does.

    Raises ValueError for a ``FROM`` it cannot read, or whose image is empty once the ``ARG``
    defaults are in: pinning would skip it and the build would then ask a registry for it.
    """
    global_args: dict[str, str] = {}
    found: list[FromLine] = []
    for start, end, line in logical_lines(dockerfile):
        if not found and (arg := _ARG.match(line)):
            global_args[arg["name"]] = (arg["value"] or "").strip("\"'")
        elif match := _FROM.match(line):
            platform = next((a.split("=", 1)[1] for a in match["args"].split() if a.startswith("--platform=")), None)
            image = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: global_args.get(m.group(1), ""), match["image"])
            if not image:
                raise ValueError(f"line {start + 1}: {line.strip()!r} names no image once its ARG defaults are substituted; give the ARG a default.")
            found.append(FromLine(start, end, image, match["stage"], platform))
        elif line.split(maxsplit=1)[0].upper() == "FROM":
            raise ValueError(f"line {start + 1}: cannot read {line.strip()!r}; write FROM [--platform=P] IMAGE [AS NAME].")
    return found


def external_bases(froms: list[FromLine]) -> list[str]:
    """The images the build needs from outside (not earlier stages, not ``scratch``)."""
    stages: set[str] = set()
    bases: list[str] = []
    for line in froms:
        if line.image.lower() not in stages and line.image != "scratch" and line.image not in bases:
            bases.append(line.image)
        if line.stage:
            stages.add(line.stage.lower())
    return bases


def pin_bases(dockerfile: str, bases: Mapping[str, str], after_each_from: list[str] = ()) -> str:
    """``dockerfile`` with each external FROM naming its resolved image, then ``after_each_from`` lines."""
    lines = dockerfile.splitlines()
    for line in reversed(parse_from_lines(dockerfile)):
        if line.image not in bases:
            continue
        stage = f" AS {line.stage}" if line.stage else ""
        platform = f"--platform={line.platform} " if line.platform else ""
        lines[line.index : line.end + 1] = [f"FROM {platform}{bases[line.image]}{stage}", *after_each_from]
    return "\n".join(lines) + "\n"


def lower_heredocs(dockerfile: str) -> str:
    """Replace heredoc instructions by equivalent ones that buildah 1.28 understands."""
    lines = dockerfile.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        match = _HEREDOC.match(lines[index])
        if not match:
            out.append(lines[index])
            index += 1
            continue
        body: list[str] = []
        index += 1
        while index < len(lines) and (lines[index].lstrip("\t") if match["dash"] else lines[index]) != match["word"]:
            body.append(lines[index].lstrip("\t") if match["dash"] else lines[index])
            index += 1
        index += 1  # the closing word
        out.append(_lowered(match, "\n".join(body) + "\n"))
    return "\n".join(out) + "\n"


def _lowered(match: re.Match[str], body: str) -> str:
    encoded = base64.b64encode(body.encode()).decode()
    decode = f"echo {encoded} | base64 -d"
    head, rest = match["head"], match["rest"].strip()
    if match["op"].upper() == "RUN":
        # RUN <<EOF runs the body with the shell; RUN <<EOF cmd feeds the body to cmd's stdin.
        return f"{head}{decode} | {rest}" if rest else f'{head}eval "$({decode})"'
    destination = rest.split()[-1] if rest else ""
    flags = dict(re.findall(r"--(chown|chmod)=(\S+)", head))
    target = shlex.quote(destination)
    steps = [f"mkdir -p \"$(dirname {target})\"", f"{decode} > {target}"]
    if "chown" in flags:
        steps.append(f"chown {shlex.quote(flags['chown'])} {target}")
    if "chmod" in flags:
        steps.append(f"chmod {shlex.quote(flags['chmod'])} {target}")
    return "RUN " + " && ".join(steps)
