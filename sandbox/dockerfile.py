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
import functools
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import dockerfile as buildkit  # BuildKit's own Dockerfile parser (Go, compiled): the one buildah's builder uses

_HEREDOC_WORD = re.compile(r"<<(?P<dash>-?)(?P<quote>[\"']?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)(?P=quote)")
_PLAIN_WORD = re.compile(r"[\w./:@+,=%-]+")


@dataclass(frozen=True)
class Instruction:
    """One instruction as BuildKit's parser reads it: continuations joined, comment and blank lines
    inside them dropped, heredoc bodies taken, the ``# escape=`` directive honoured."""

    start: int  # first physical line, 0-based
    end: int  # last physical line (continuations, comments inside them and heredoc bodies included)
    keyword: str  # upper case
    flags: tuple[str, ...]  # the leading ``--name=value`` flags, unquoted as the builder reads them
    words: tuple[str, ...]  # the arguments: RUN's shell form is one string; other words are as written
    json: bool  # the JSON (exec) form
    text: str  # the instruction on one line (with heredoc bodies after it)
    heredocs: tuple[tuple[str, str], ...] = ()  # (delimiter, body)


@dataclass(frozen=True)
class FromLine:
    index: int  # first physical line of the instruction
    end: int  # last physical line (continuations included)
    image: str  # the reference as the builder reads it, global ARG defaults substituted
    stage: str | None
    platform: str | None


def parse(dockerfile: str) -> tuple[Instruction, ...]:
    """The instructions of ``dockerfile``, read by BuildKit's parser; ValueError if it cannot read them."""
    return _parse(dockerfile)


@functools.lru_cache(maxsize=64)
def _parse(dockerfile: str) -> tuple[Instruction, ...]:
    try:
        commands = buildkit.parse_string(dockerfile)
    except buildkit.GoParseError as error:
        if "no instructions" in str(error):
            return ()
        raise ValueError(f"the Dockerfile cannot be read as the builder reads it: {error}") from None
    return tuple(
        Instruction(
            start=command.start_line - 1,
            end=command.end_line - 1,
            keyword=command.cmd.upper(),
            flags=tuple(command.flags),
            words=tuple(command.value),
            json=command.json,
            text=command.original,
            heredocs=tuple((heredoc.name, heredoc.content) for heredoc in command.heredocs),
        )  # fmt: skip
        for command in commands
    )


def physical_lines(dockerfile: str) -> list[str]:
    """The lines the parser numbers: split at newlines only (``str.splitlines`` also splits at form
    feeds and Unicode separators, which the parser keeps inside a line)."""
    lines = dockerfile.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def joined(lines: Sequence[str]) -> str:
    return "\n".join(lines) + "\n"


def escape_character(dockerfile: str) -> str:
    """The escape character of ``dockerfile`` (set by a ``# escape=`` directive; backslash without one).

    Asked of the parser itself, so directive rules (only at the very top, before any comment
    that is no directive) are the parser's: the file's leading comment lines, then a probe
    that is one instruction only if a backquote continues a line.
    """
    instructions = parse(dockerfile)
    header = physical_lines(dockerfile)[: instructions[0].start] if instructions else []
    return "`" if len(buildkit.parse_string(joined([*header, "RUN a `", "RUN b"]))) == 1 else "\\"


def shell_word(word: str, escape: str = "\\") -> str:
    """``word`` as the builder's shell lexer reads it (quotes removed, escapes resolved), variables left as written.

    BuildKit and buildah run each ``ADD``/``COPY`` word and each ``FROM`` image through this
    lexer: ``"http://h/x"`` and ``http\\://h/x`` both name ``http://h/x``.
    """
    out: list[str] = []
    quote = ""
    chars = iter(word)
    for char in chars:
        if quote == "'" and char != "'":
            out.append(char)
        elif char == escape and quote != "'":
            following = next(chars, "")
            if quote == '"' and following not in ('"', "$", escape, ""):
                out.append(char)  # inside double quotes only these are escaped
            out.append(following)
        elif char in "'\"" and quote in ("", char):
            quote = "" if quote else char
        else:
            out.append(char)
    return "".join(out)


def quoted_word(value: str, escape: str = "\\") -> str:
    """``value`` written as one word the shell lexer reads back as ``value``."""
    if _PLAIN_WORD.fullmatch(value):
        return value
    return '"' + "".join(escape + char if char in ('"', "$", escape) else char for char in value) + '"'


def _flag_text(flag: str) -> str:
    """A parsed flag written so that the parser's flag reader (which always escapes with a backslash) reads it back."""
    name, equals, value = flag.partition("=")
    if not equals or _PLAIN_WORD.fullmatch(value):
        return flag
    return f'{name}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def emit(keyword: str, flags: Sequence[str], words: Sequence[str], *, json_form: bool = False, escape: str = "\\") -> str:
    """One instruction on one line, from parsed parts; read back through the parser, so that what is
    written is what the builder will read (ValueError where it is not)."""
    arguments = json.dumps(list(words)) if json_form else " ".join(words)
    line = " ".join(part for part in (keyword, *map(_flag_text, flags), arguments) if part)
    directive = ["# escape=`"] if escape == "`" else []
    read = parse(joined([*directive, line]))
    if len(read) != 1 or (read[0].keyword, read[0].flags, read[0].words, read[0].json) != (keyword.upper(), tuple(flags), tuple(words), json_form):
        raise ValueError(f"cannot write {line!r} so that the builder reads it back as it is meant; write the instruction more plainly.")
    return line


def replace_instruction(lines: list[str], instruction: Instruction, text: str) -> None:
    """Put ``text`` where ``instruction`` was, its other physical lines left blank (later line numbers stay)."""
    lines[instruction.start : instruction.end + 1] = [text] + [""] * (instruction.end - instruction.start)


def _global_args(instructions: Sequence[Instruction], escape: str) -> dict[str, str]:
    """The ``ARG`` defaults before the first ``FROM`` (an ARG without a default is empty)."""
    values: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            for word in instruction.words:
                name, _, value = word.partition("=")
                values[name] = shell_word(value, escape)
    return values


def parse_from_lines(dockerfile: str) -> list[FromLine]:
    """The ``FROM`` lines, with global ``ARG`` defaults substituted as Docker does.

    Raises ValueError for a ``FROM`` it cannot read, or whose image is empty once the ``ARG``
    defaults are in: pinning would skip it and the build would then ask a registry for it.
    """
    instructions = parse(dockerfile)
    escape = escape_character(dockerfile)
    global_args = _global_args(instructions, escape)
    return [_from_line(instruction, global_args, escape) for instruction in instructions if instruction.keyword == "FROM"]


def _from_line(instruction: Instruction, global_args: Mapping[str, str], escape: str) -> FromLine:
    words = instruction.words
    if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
        raise ValueError(f"line {instruction.start + 1}: cannot read {instruction.text.strip()!r}; write FROM [--platform=P] IMAGE [AS NAME].")
    platform = next((flag.split("=", 1)[1] for flag in instruction.flags if flag.startswith("--platform=")), None)
    image = shell_word(re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: global_args.get(m.group(1), ""), words[0]), escape)
    if not image:
        raise ValueError(f"line {instruction.start + 1}: {instruction.text.strip()!r} names no image once its ARG defaults are substituted; give the ARG a default.")
    return FromLine(instruction.start, instruction.end, image, words[2] if len(words) == 3 else None, platform)


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
    lines = physical_lines(dockerfile)
    for line in reversed(parse_from_lines(dockerfile)):
        if line.image not in bases:
            continue
        stage = f" AS {line.stage}" if line.stage else ""
        platform = f"--platform={line.platform} " if line.platform else ""
        lines[line.index : line.end + 1] = [f"FROM {platform}{bases[line.image]}{stage}", *after_each_from]
    return joined(lines)


def lower_heredocs(dockerfile: str) -> str:
    """Replace heredoc instructions by equivalent ones that buildah 1.28 understands.

    The heredocs are the ones the parser finds: in the instruction once its continuations are
    joined, wherever in it they stand (``RUN cat <<EOF > /x``). buildah reads no heredocs, so a
    body left behind would be read by it as instructions of their own.
    """
    instructions = [instruction for instruction in parse(dockerfile) if instruction.heredocs]
    if not instructions:
        return dockerfile
    escape = escape_character(dockerfile)
    lines = physical_lines(dockerfile)
    for instruction in reversed(instructions):
        try:
            lowered = emit("RUN", *_lowered(instruction), escape=escape)
        except ValueError as error:
            raise ValueError(f"line {instruction.start + 1}: {error}") from None
        lines[instruction.start : instruction.end + 1] = [lowered]
    return joined(lines)


def _lowered(instruction: Instruction) -> tuple[tuple[str, ...], list[str]]:
    """The flags and command of the ``RUN`` that does what a heredoc instruction does."""
    if instruction.keyword == "RUN" and not instruction.json:
        return instruction.flags, [_heredoc_script(instruction.words[0], instruction.heredocs)]
    if instruction.keyword in ("COPY", "ADD"):
        return (), [_heredoc_files(instruction)]
    raise ValueError(f"{instruction.keyword} with a heredoc cannot be lowered for buildah 1.28; write the file into the environment folder instead.")


def _decode(body: str) -> str:
    """A shell pipeline printing ``body``, carried base64-encoded (no quoting to get wrong)."""
    return f"echo {base64.b64encode(body.encode()).decode()} | base64 -d"


def _chomped(marker: re.Match[str], body: str) -> str:
    """The body as ``<<-`` leaves it: leading tabs removed from each line."""
    return re.sub(r"(?m)^\t+", "", body) if marker["dash"] else body


def _heredoc_script(command: str, heredocs: Sequence[tuple[str, str]]) -> str:
    """``RUN <<EOF`` runs the body with the shell; ``RUN <<EOF cmd`` feeds it to cmd's stdin; any
    other command line is handed to the shell with its heredocs after it, which the shell reads itself."""
    marker = _HEREDOC_WORD.match(command.strip())
    if marker and len(heredocs) == 1:
        body = _chomped(marker, heredocs[0][1])
        rest = command.strip()[marker.end() :].strip()
        if not rest:
            return f'eval "$({_decode(body)})"'
        if "<<" not in rest:
            return f"{_decode(body)} | {rest}"
    script = command + "\n" + "".join(f"{body}{name}\n" for name, body in heredocs)
    return f'eval "$({_decode(script)})"'


def _heredoc_files(instruction: Instruction) -> str:
    """The shell command writing each heredoc of a ``COPY <<EOF /path`` (or ``ADD``), with its --chown and --chmod."""
    *sources, destination = instruction.words
    markers = [_HEREDOC_WORD.fullmatch(source) for source in sources]
    if not sources or len(sources) != len(instruction.heredocs) or not all(markers):
        raise ValueError(f"{instruction.keyword} mixes heredocs and files; give the files a {instruction.keyword} line of their own.")
    if len(sources) > 1 and not destination.endswith("/"):
        raise ValueError(f"{instruction.keyword} of several heredocs needs a destination folder ending in '/'.")
    flags = dict(flag[2:].partition("=")[::2] for flag in instruction.flags)
    steps: list[str] = []
    for marker, (name, body) in zip(markers, instruction.heredocs, strict=True):
        assert marker is not None, "checked above"
        target = shlex.quote(destination + name if destination.endswith("/") else destination)
        steps += [f'mkdir -p "$(dirname {target})"', f"{_decode(_chomped(marker, body))} > {target}"]
        steps += [f"{command} {shlex.quote(flags[flag])} {target}" for flag, command in (("chown", "chown"), ("chmod", "chmod")) if flag in flags]
    return " && ".join(steps)


#: The empty stage :func:`create_workdirs` copies from, so a WORKDIR is made without a shell in the image.
EMPTY_STAGE = "prefect-harbor-empty"


def with_arg_defaults(dockerfile: str, values: Mapping[str, str]) -> str:
    """``dockerfile`` with its global ``ARG`` defaults set to ``values`` (what ``--build-arg`` does for
    them), so the FROM lines name what the build will use; a value for an ARG it lacks is an error."""
    lines = physical_lines(dockerfile)
    escape = escape_character(dockerfile)
    missing = set(values)
    for instruction in parse(dockerfile):
        if instruction.keyword == "FROM":
            break
        names = [word.partition("=")[0] for word in instruction.words]
        if instruction.keyword == "ARG" and missing & set(names):
            words = [f"{name}={quoted_word(values[name], escape)}" if name in values else word for name, word in zip(names, instruction.words, strict=True)]
            replace_instruction(lines, instruction, emit("ARG", [], words, escape=escape))
            missing -= set(names)
    if missing:
        raise ValueError(f"no global ARG {', '.join(sorted(missing))} to set")
    return joined(lines) if values else dockerfile


def _mount_options(flag: str) -> list[tuple[str, str]]:
    """The ``key=value`` options of a ``--mount=`` flag."""
    return [(key.strip().lower(), value) for key, _, value in (part.partition("=") for part in flag.split("=", 1)[1].split(","))]


def _sources(instruction: Instruction) -> list[str]:
    """What an instruction copies or mounts from: ``COPY --from=X``, ``RUN --mount=...,from=X``."""
    if instruction.keyword == "COPY":
        return [flag.split("=", 1)[1] for flag in instruction.flags if flag.lower().startswith("--from=")]
    if instruction.keyword != "RUN":
        return []
    return [value for flag in instruction.flags if flag.lower().startswith("--mount=") for key, value in _mount_options(flag) if key == "from"]


def copy_from_images(dockerfile: str, froms: list[FromLine]) -> list[str]:
    """The images ``COPY --from=`` (or a ``RUN --mount=...,from=``) names that are no stage of this build
    (``COPY --from=ghcr.io/astral-sh/uv:0.8.15 /uv /uvx /bin/``): the build needs them from outside, like a FROM's base."""
    stages = {line.stage.lower() for line in froms if line.stage}
    images: list[str] = []
    for instruction in parse(dockerfile):
        for source in _sources(instruction):
            if not source.isdigit() and source.lower() not in stages and "$" not in source and source not in images:
                images.append(source)
    return images


def variable_copy_sources(dockerfile: str) -> list[str]:
    """``COPY --from=`` and mount ``from=`` sources named through a variable (``--from=${X}``): only the
    builder would know what they name, unpinned, so it could be any image in its storage."""
    return [source for instruction in parse(dockerfile) for source in _sources(instruction) if "$" in source]


def pin_copy_sources(dockerfile: str, images: Mapping[str, str]) -> str:
    """``dockerfile`` with each ``COPY --from=<image>`` (and ``RUN --mount=...,from=<image>``) in ``images``
    naming the local image it resolved to; each such instruction written anew, on one line."""
    lines = physical_lines(dockerfile)
    escape = escape_character(dockerfile)
    changed = False
    for instruction in parse(dockerfile):
        if set(_sources(instruction)) & set(images):
            flags = [_pinned_flag(flag, images) for flag in instruction.flags]
            replace_instruction(lines, instruction, emit(instruction.keyword, flags, instruction.words, json_form=instruction.json, escape=escape))
            changed = True
    return joined(lines) if changed else dockerfile


def _pinned_flag(flag: str, images: Mapping[str, str]) -> str:
    name, _, value = flag.partition("=")
    if name.lower() == "--from":
        return f"{name}={images.get(value, value)}"
    if name.lower() != "--mount":
        return flag
    parts = [part if part.partition("=")[0].strip().lower() != "from" else f"from={images.get(part.partition('=')[2], part.partition('=')[2])}" for part in value.split(",")]
    return f"{name}={','.join(parts)}"


def create_workdirs(dockerfile: str) -> str:
    """``dockerfile`` with every ``WORKDIR`` of its final stage created where it is declared, as Docker does.

    Each WORKDIR is followed by a copy of an empty stage into it (``COPY --from=`` an empty
    ``scratch`` stage, added before the final stage, so images without a shell get theirs too):
    a missing folder is created, owned by the USER in effect as BuildKit does, and an existing
    one is left as it is. The USER is the stage's own, or the one of the earlier stage it is
    built on; a USER that only a base image sets is not known here, and its folders are root's.
    """
    instructions = parse(dockerfile)
    starts = [position for position, instruction in enumerate(instructions) if instruction.keyword == "FROM"]
    if not starts:
        return dockerfile
    final = instructions[starts[-1]]
    inserts: list[tuple[int, str]] = []
    user = _user_at_stage_ends(instructions[: starts[-1]]).get(_base_of(final))
    for instruction in instructions[starts[-1] + 1 :]:
        if instruction.keyword == "USER":
            user = _user_of(instruction)
        elif instruction.keyword == "WORKDIR":
            chown = f" --chown={user}" if user and user.split(":")[0] not in ("root", "0") else ""
            inserts.append((instruction.end + 1, f"COPY --from={EMPTY_STAGE}{chown} . ./"))
    if not inserts:
        return dockerfile
    lines = physical_lines(dockerfile)
    for index, text in [*reversed(inserts), (final.start, f"FROM scratch AS {EMPTY_STAGE}")]:
        lines.insert(index, text)
    return joined(lines)


def final_workdir(dockerfile: str) -> str | None:
    """The working folder the final stage's own ``WORKDIR`` lines leave (relative ones joined
    to the one before), or None when it sets none (its base image's is not known here)."""
    instructions = parse(dockerfile)
    starts = [position for position, instruction in enumerate(instructions) if instruction.keyword == "FROM"]
    workdir: str | None = None
    for instruction in instructions[starts[-1] + 1 :] if starts else ():
        if instruction.keyword == "WORKDIR" and instruction.words:
            folder = " ".join(instruction.words).strip().strip('"')
            workdir = folder if folder.startswith("/") or workdir is None else f"{workdir.rstrip('/')}/{folder}"
    return workdir if workdir and workdir.startswith("/") and "$" not in workdir else None


def _base_of(instruction: Instruction) -> str:
    return instruction.words[0].lower() if instruction.words else ""


def _stage_of(instruction: Instruction) -> str | None:
    return instruction.words[2].lower() if len(instruction.words) == 3 and instruction.words[1].upper() == "AS" else None


def _user_of(instruction: Instruction) -> str | None:
    return " ".join(instruction.words).strip() or None


def _user_at_stage_ends(instructions: Sequence[Instruction]) -> dict[str, str | None]:
    """The USER each stage ends with, by its index and its name; a stage built on another starts with that one's USER."""
    ends: dict[str, str | None] = {}
    keys: list[str] = []
    user: str | None = None
    stage = -1
    for instruction in instructions:
        if instruction.keyword == "FROM":
            ends.update(dict.fromkeys(keys, user))
            stage += 1
            keys = [str(stage), *filter(None, [_stage_of(instruction)])]
            user = ends.get(_base_of(instruction))
        elif instruction.keyword == "USER":
            user = _user_of(instruction)
    ends.update(dict.fromkeys(keys, user))
    return ends
