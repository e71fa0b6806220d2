"""Reading and rewriting a task's Dockerfile text before podman builds it.

Rewrites, each because the engine would otherwise build something other than what the
task's author meant:

* ``FROM`` lines, and ``COPY --from=<image>`` (or ``RUN --mount=...,from=<image>``) of an
  image that is no stage, are pinned to the local image each reference resolved to (a bootstrapped base, or a stand-in), so the
  build never asks a registry for them.
* Heredocs (``RUN <<EOF``, ``COPY <<EOF /path``) are lowered to plain instructions,
  because the buildah in Debian 12 (1.28) predates heredoc support: the body is carried
  base64-encoded and decoded in the build container (``base64`` from coreutils/busybox).
* Every ``WORKDIR`` of the final stage is created in the image, as Docker's builder does:
  buildah 1.28 creates one only when a later instruction writes into it, and podman 4.3
  then refuses ``--workdir`` for it.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Mapping, Sequence
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


def pin_bases(dockerfile: str, bases: Mapping[str, str], after_each_from: Sequence[str] = ()) -> str:
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


#: The empty stage :func:`create_workdirs` copies from, so a WORKDIR is made without a shell in the image.
EMPTY_STAGE = "prefect-harbor-empty"


def _keyword(instruction: str) -> str:
    return instruction.split(maxsplit=1)[0].upper() if instruction.strip() else ""


def _flags(instruction: str) -> dict[str, str]:
    """The ``--name=value`` flags that follow an instruction's keyword."""
    flags: dict[str, str] = {}
    for word in instruction.split()[1:]:
        if not word.startswith("--"):
            break
        name, _, value = word[2:].partition("=")
        flags[name.lower()] = value
    return flags


def with_arg_defaults(dockerfile: str, values: Mapping[str, str]) -> str:
    """``dockerfile`` with its global ``ARG`` defaults set to ``values`` (what ``--build-arg`` does for
    them), so the FROM lines name what the build will use; a value for an ARG it lacks is an error."""
    lines = dockerfile.splitlines()
    missing = set(values)
    for start, _, line in logical_lines(dockerfile):
        if _keyword(line) == "FROM":
            break
        if (arg := _ARG.match(line)) and arg["name"] in values:
            lines[start] = f"ARG {arg['name']}={values[arg['name']]}"
            missing.discard(arg["name"])
    if missing:
        raise ValueError(f"no global ARG {', '.join(sorted(missing))} to set")
    return "\n".join(lines) + "\n"


def _sources(instruction: str) -> list[str]:
    """What an instruction copies or mounts from: ``COPY --from=X``, ``RUN --mount=...,from=X``."""
    keyword = _keyword(instruction)
    if keyword == "COPY":
        return [source] if (source := _flags(instruction).get("from")) else []
    if keyword != "RUN":
        return []
    mounts = [word.split("=", 1)[1] for word in instruction.split()[1:] if word.lower().startswith("--mount=")]
    return [value for spec in mounts for key, _, value in (part.partition("=") for part in spec.split(",")) if key.strip().lower() == "from"]


def copy_from_images(dockerfile: str, froms: list[FromLine]) -> list[str]:
    """The images ``COPY --from=`` (or a ``RUN --mount=...,from=``) names that are no stage of this build
    (``COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/``): the build needs them from outside, like a FROM's base."""
    stages = {line.stage.lower() for line in froms if line.stage}
    images: list[str] = []
    for _, _, line in logical_lines(dockerfile):
        for source in _sources(line):
            if not source.isdigit() and source.lower() not in stages and "$" not in source and source not in images:
                images.append(source)
    return images


def pin_copy_sources(dockerfile: str, images: Mapping[str, str]) -> str:
    """``dockerfile`` with each ``COPY --from=<image>`` (and ``RUN --mount=...,from=<image>``) in ``images``
    naming the local image it resolved to."""
    lines = dockerfile.splitlines()
    for start, end, line in logical_lines(dockerfile):
        for source in set(_sources(line)) & set(images):
            option = re.compile(rf"(?P<key>--from=|[=,]from=){re.escape(source)}(?=[\s,]|$)", re.IGNORECASE)
            replacement = r"\g<key>" + images[source].replace("\\", r"\\")
            for index in range(start, end + 1):
                lines[index] = option.sub(replacement, lines[index])
    return "\n".join(lines) + "\n"


def create_workdirs(dockerfile: str) -> str:
    """``dockerfile`` with every ``WORKDIR`` of its final stage created where it is declared, as Docker does.

    Each WORKDIR is followed by a copy of an empty stage into it (``COPY --from=`` an empty
    ``scratch`` stage, added before the final stage, so images without a shell get theirs too):
    a missing folder is created, owned by the USER in effect as BuildKit does, and an existing
    one is left as it is. The USER is the stage's own, or the one of the earlier stage it is
    built on; a USER that only a base image sets is not known here, and its folders are root's.
    """
    instructions = logical_lines(dockerfile)
    starts = [position for position, (_, _, line) in enumerate(instructions) if _FROM.match(line)]
    if not starts:
        return dockerfile
    final = starts[-1]
    inserts: list[tuple[int, str]] = []
    final_from = _FROM.match(instructions[final][2])
    assert final_from is not None, "a stage starts at a FROM line"
    user = _user_at_stage_ends(instructions[:final]).get(final_from["image"].lower())
    for _, end, line in instructions[final + 1 :]:
        if _keyword(line) == "USER":
            user = _user_of(line)
        elif _keyword(line) == "WORKDIR":
            chown = f" --chown={user}" if user and user.split(":")[0] not in ("root", "0") else ""
            inserts.append((end + 1, f"COPY --from={EMPTY_STAGE}{chown} . ./"))
    if not inserts:
        return dockerfile
    lines = dockerfile.splitlines()
    for index, text in [*reversed(inserts), (instructions[final][0], f"FROM scratch AS {EMPTY_STAGE}")]:
        lines.insert(index, text)
    return "\n".join(lines) + "\n"


def final_workdir(dockerfile: str) -> str | None:
    """The working folder the final stage's own ``WORKDIR`` lines leave (relative ones joined
    to the one before), or None when it sets none (its base image's is not known here)."""
    instructions = logical_lines(dockerfile)
    starts = [position for position, (_, _, line) in enumerate(instructions) if _FROM.match(line)]
    workdir: str | None = None
    for _, _, line in instructions[starts[-1] + 1 :] if starts else ():
        if _keyword(line) == "WORKDIR" and len(words := line.split(maxsplit=1)) == 2:
            folder = words[1].strip().strip('"')
            workdir = folder if folder.startswith("/") or workdir is None else f"{workdir.rstrip('/')}/{folder}"
    return workdir if workdir and workdir.startswith("/") and "$" not in workdir else None


def _user_of(instruction: str) -> str | None:
    words = instruction.split(maxsplit=1)
    return words[1].strip() if len(words) > 1 else None


def _user_at_stage_ends(instructions: list[tuple[int, int, str]]) -> dict[str, str | None]:
    """The USER each stage ends with, by its index and its name; a stage built on another starts with that one's USER."""
    ends: dict[str, str | None] = {}
    keys: list[str] = []
    user: str | None = None
    stage = -1
    for _, _, line in instructions:
        if match := _FROM.match(line):
            ends.update(dict.fromkeys(keys, user))
            stage += 1
            keys = [str(stage), *([match["stage"].lower()] if match["stage"] else [])]
            user = ends.get(match["image"].lower())
        elif _keyword(line) == "USER":
            user = _user_of(line)
    ends.update(dict.fromkeys(keys, user))
    return ends
