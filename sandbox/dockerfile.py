"""What the bubblewrap sandbox can honour of a task's Dockerfile.

The sandbox has no image build: its base filesystem stands in for the ``FROM`` image.
It honours the instructions that only describe the runtime (``WORKDIR``, ``ENV``,
``USER``, ``ARG`` defaults used by them) and ignores pure metadata. Instructions that
would change the filesystem (``RUN``, ``COPY``, ``ADD``, ``ONBUILD``) cannot be
reproduced; they are reported line by line so the task fails before its trial starts.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

#: Instructions the sandbox applies to every exec.
HONOURED = frozenset({"FROM", "WORKDIR", "ENV", "USER", "ARG"})
#: Instructions that only matter to an image build or a `docker run`, harmless to skip.
METADATA = frozenset(
    {"LABEL", "MAINTAINER", "EXPOSE", "CMD", "ENTRYPOINT", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "VOLUME"}
)
#: Instructions that change the image's filesystem: the sandbox cannot reproduce them.
UNSUPPORTED = frozenset({"RUN", "COPY", "ADD", "ONBUILD"})

_VARIABLE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    arguments: str

    def __str__(self) -> str:
        return f"{self.keyword} {self.arguments}".strip()


@dataclass
class DockerfileRuntime:
    """The runtime view of a Dockerfile's final stage."""

    base_image: str | None = None
    workdir: str | None = None
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    unsupported: list[Instruction] = field(default_factory=list)


class UnsupportedDockerfileError(ValueError):
    """A task's Dockerfile needs an image build the sandbox cannot do."""

    def __init__(self, path: Path, instructions: list[Instruction]):
        self.path = path
        self.instructions = instructions
        lines = "\n".join(f"  line {i.line}: {_shorten(str(i))}" for i in instructions)
        super().__init__(
            f"{path} has instructions the bubblewrap sandbox cannot reproduce "
            f"(it has no image build; its base filesystem stands in for FROM):\n{lines}\n"
            "Fix one of: run this task in a Harbor container environment "
            "(environment type 'docker' or 'podman'); prepare a root filesystem that "
            "already has what these lines install and pass it as the sandbox's "
            "`rootfs`; or set the sandbox option "
            "`ignore_unsupported_dockerfile_instructions = true` to skip them."
        )


def parse_dockerfile(path: Path) -> DockerfileRuntime:
    """Read ``path`` and return what the sandbox would apply; nothing is executed."""
    runtime = DockerfileRuntime()
    args: dict[str, str] = {}
    for instruction in _instructions(path.read_text(encoding="utf-8")):
        keyword, arguments = instruction.keyword, instruction.arguments
        if keyword == "FROM":
            # A new stage starts from scratch; only the final stage reaches the runtime.
            runtime = DockerfileRuntime(
                base_image=arguments.split()[0] if arguments else None,
                unsupported=runtime.unsupported,
            )
        elif keyword == "ARG":
            name, _, default = arguments.partition("=")
            args.setdefault(name.strip(), _unquote(default.strip()))
        elif keyword == "ENV":
            scope = {**args, **runtime.env}
            for name, value in _env_pairs(arguments):
                runtime.env[name] = _substitute(value, scope)
        elif keyword == "WORKDIR":
            target = _substitute(_unquote(arguments), {**args, **runtime.env})
            runtime.workdir = posixpath.normpath(posixpath.join(runtime.workdir or "/", target))
        elif keyword == "USER":
            runtime.user = _substitute(arguments, {**args, **runtime.env}) or None
        elif keyword in UNSUPPORTED:
            runtime.unsupported.append(instruction)
        elif keyword not in METADATA:
            runtime.unsupported.append(instruction)
    return runtime


def _instructions(text: str) -> list[Instruction]:
    """Split a Dockerfile into instructions, joining backslash continuations."""
    instructions: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker too
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer.append(stripped[:-1])
            continue
        buffer.append(stripped)
        keyword, _, arguments = " ".join(buffer).strip().partition(" ")
        instructions.append(Instruction(start, keyword.upper(), arguments.strip()))
        buffer = []
    if buffer:
        keyword, _, arguments = " ".join(buffer).strip().partition(" ")
        instructions.append(Instruction(start, keyword.upper(), arguments.strip()))
    return instructions


def _env_pairs(arguments: str) -> list[tuple[str, str]]:
    tokens = shlex.split(arguments, posix=True)
    if tokens and "=" not in tokens[0]:
        # Legacy form: `ENV NAME value with spaces`.
        name, _, value = arguments.partition(" ")
        return [(name, value.strip())]
    return [(token.partition("=")[0], token.partition("=")[2]) for token in tokens]


def _substitute(value: str, scope: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        default = match.group("default")
        return scope.get(name) or (default if default is not None else "")

    return _VARIABLE.sub(replace, value)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
