"""A task's Dockerfile, made unable to reach the host through the builder itself.

``RUN`` steps run in containers as contained as trials (:mod:`.images`). Three instructions act
in the builder, on the host, instead:

* ``RUN --mount=type=bind|cache,from=<stage or image>,source=<path>``: Debian 12's buildah
  (1.28) resolves the source on the host, following a symlink out of the stage
  (CVE-2024-1753: ``ln -s / /rootdir`` in one stage mounts the host's root in the next).
  Each such mount is lowered: a scratch stage of its own first copies the source with
  ``COPY --from`` (which resolves links inside the stage), and the mount takes the copy, a
  plain folder or file, from there. ``rw`` mounts keep their meaning (writes are discarded).
  A mount from the build context is kept, once its source is checked to resolve inside it.
* Cache mounts (``type=cache``) are shared host-wide by their id (or target): one task's
  build could plant files in the pip or apt cache of the next. Each gets an id private to
  the task's environment (its folder and Dockerfile), which its rebuilds after an edit share.
* ``ADD <url>``: buildah fetches the URL from the host, whose loopback holds the Prefect API.
  The URL is fetched here instead (:mod:`.remote_sources`), only from public addresses, and
  handed to the build as a file.

``RUN --network``/``--security`` flags (later builders' ways out of the build's network and
privileges) are refused, naming the line.

The Dockerfile is read with BuildKit's own parser (:func:`.dockerfile.parse`), as the builder
reads it: a comment line inside a continuation, an ``# escape=`` directive, a quoted or escaped
``ADD`` source cannot make the guard see other instructions than the builder does. An instruction
that needs rewriting is written anew on one line from its parsed parts; the others stay as written.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from prefect_harbor.sandbox.dockerfile import Instruction, emit, escape_character, joined, parse, physical_lines, replace_instruction, shell_word

#: The prefix of the stages and build contexts this module adds.
PREFIX = "prefect-harbor"
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://", re.IGNORECASE)
#: Git sources BuildKit's ADD clones: ``git@host:path`` (and other scp-like forms), ``*.git`` URLs.
_GIT = re.compile(r"^[\w.-]+@[\w.-]+:|^[a-z][a-z0-9+.-]*://[^#?]*\.git(?:[#?].*)?$", re.IGNORECASE)
_PLAIN_PATH = re.compile(r"[\w./@+-]+")


class UnsafeDockerfileError(ValueError):
    """A Dockerfile line the builder would run against the host; the message names the line and the fix."""


@dataclass
class Guarded:
    """The rewritten Dockerfile and what the build must be given for it."""

    text: str
    #: ``ADD`` sources to fetch: (build context name, file name, url); see :mod:`.remote_sources`.
    downloads: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Mount:
    """A ``RUN --mount`` spec, its options split at commas as buildah splits them."""

    spec: str
    options: dict[str, str]
    order: list[str]

    @classmethod
    def parse(cls, spec: str) -> Mount:
        options: dict[str, str] = {}
        order: list[str] = []
        for part in spec.split(","):
            key, _, value = part.partition("=")
            key = key.strip().lower()
            options[key] = value.strip() if _ else "true"
            order.append(key)
        return cls(spec, options, order)

    @property
    def kind(self) -> str:
        return self.options.get("type", "bind").lower()

    @property
    def source(self) -> str | None:
        return self.options.get("source", self.options.get("src"))

    def replaced(self, **changes: str | None) -> str:
        options = dict(self.options)
        order = list(self.order)
        for key, value in changes.items():
            if value is None:
                options.pop(key, None)
                order = [k for k in order if k != key]
            else:
                if key not in options:
                    order.append(key)
                options[key] = value
        return ",".join(key if options[key] == "true" and key in ("rw", "readwrite", "ro", "readonly") else f"{key}={options[key]}" for key in order)


@dataclass(frozen=True)
class _Keys:
    image: str  # the image's content digest: names the stages added for mounts
    cache: str  # the environment's: names its cache mounts


def guard(dockerfile: str, context: Path, image_key: str, cache_key: str | None = None) -> Guarded:
    """``dockerfile`` (heredocs already lowered) rewritten as the module docstring says.

    ``image_key`` (the image's content digest) makes the stages added for mounts private to this
    image: buildah's layer cache keys a ``RUN`` by its text, not by what it mounts. ``cache_key``
    (default ``image_key``) makes cache mounts' ids private to one environment.
    ``context`` is the build context that sources of context mounts must stay in. Raises
    :class:`UnsafeDockerfileError` for what cannot be made safe.
    """
    instructions = parse(dockerfile)
    _refuse_heredocs(instructions)
    escape = escape_character(dockerfile)
    if mounting := next((instruction for instruction in instructions if any("from" in mount.options for mount in _mounts(instruction))), None):
        _refuse_other_escape(escape, mounting)
        dockerfile = _name_every_stage(dockerfile)
        instructions = parse(dockerfile)
    stage_names = [_stage_name(instruction) for instruction in instructions if instruction.keyword == "FROM"]
    guarded = Guarded(text=dockerfile)
    lines = physical_lines(dockerfile)
    inserted: dict[int, list[str]] = {}  # first physical line of a FROM -> scratch stages to put before it
    current_from = 0
    counter = iter(range(1_000_000))
    for instruction in instructions:
        if instruction.keyword == "FROM":
            current_from = instruction.start
        replacement, stages = _guarded(instruction, context, _Keys(image_key, cache_key or image_key), stage_names, guarded, counter, escape)
        if replacement is not None:
            _refuse_other_escape(escape, instruction)
            replace_instruction(lines, instruction, replacement)
            inserted.setdefault(current_from, []).extend(stages)
    if inserted or lines != physical_lines(dockerfile):
        guarded.text = joined([text for index, line in enumerate(lines) for text in [*inserted.get(index, []), line]])
    return guarded


def _guarded(
    instruction: Instruction, context: Path, keys: _Keys, stage_names: Sequence[str], guarded: Guarded, counter: Iterator[int], escape: str
) -> tuple[str | None, list[str]]:  # fmt: skip
    """The instruction's replacement (None: keep it as written) and the stages it needs before its own."""
    line = instruction.start + 1
    if instruction.keyword == "RUN":
        return _guard_run(instruction, line, context, keys, stage_names, counter)
    if instruction.keyword == "ADD":
        return _guard_add(instruction, line, guarded, counter, escape), []
    if instruction.keyword == "ONBUILD":
        _refuse_unsafe_trigger(instruction, line, context, escape)
    return None, []


def _refuse_heredocs(instructions: Sequence[Instruction]) -> None:
    """buildah 1.28 reads no heredocs: the body of one left in would be run as instructions the guard never saw."""
    if heredoc := next((instruction for instruction in instructions if instruction.heredocs), None):
        raise UnsafeDockerfileError(f"line {heredoc.start + 1}: a heredoc reached the guard unlowered; lower it first (dockerfile.lower_heredocs).")


def _refuse_other_escape(escape: str, instruction: Instruction) -> None:
    if escape != "\\":
        raise UnsafeDockerfileError(
            f"line {instruction.start + 1}: {instruction.keyword} must be rewritten before the build, and this Dockerfile's "
            f"'# escape={escape}' directive is one the rewrite does not write for; remove the directive and continue lines with a backslash."
        )


def _refuse_unsafe_trigger(instruction: Instruction, line: int, context: Path, escape: str) -> None:
    """An ``ONBUILD`` trigger runs in a later build, which this guard does not see: one that would need rewriting is refused."""
    directive = "# escape=`\n" if escape == "`" else ""
    trigger = [replace(read, start=instruction.start, end=instruction.end) for read in parse(directive + instruction.text.split(maxsplit=1)[-1] + "\n")]
    if trigger and _guarded(trigger[0], context, _Keys("onbuild", "onbuild"), [], Guarded(text=""), iter(range(1)), escape)[0] is not None:
        raise UnsafeDockerfileError(f"line {line}: ONBUILD {trigger[0].keyword} would run unguarded in a later build; remove the trigger or make it a plain instruction.")


def _stage_name(instruction: Instruction) -> str:
    """The name a ``FROM ... AS name`` gives its stage; empty without one."""
    return instruction.words[2] if len(instruction.words) == 3 and instruction.words[1].upper() == "AS" else ""


def _mounts(instruction: Instruction) -> list[Mount]:
    return [Mount.parse(flag.split("=", 1)[1]) for flag in instruction.flags if flag.lower().startswith("--mount=")] if instruction.keyword == "RUN" else []


def _guard_run(
    instruction: Instruction, line: int, context: Path, keys: _Keys, stage_names: Sequence[str], counter: Iterator[int]
) -> tuple[str | None, list[str]]:  # fmt: skip
    stages: list[str] = []
    kept: list[str] = []
    for flag in instruction.flags:
        name, _, value = flag.partition("=")
        if name.lower() in ("--network", "--security"):
            raise UnsafeDockerfileError(
                f"line {line}: RUN {flag} would take the step out of the build's network or privileges; remove the flag "
                "(RUN steps reach the internet through the sandbox's own network)."
            )
        if "$" in flag:
            raise UnsafeDockerfileError(f"line {line}: RUN {flag}: a variable in a RUN flag is only known once the builder fills it in; write the flag literally.")
        if name.lower() != "--mount":
            kept.append(flag)
            continue
        mount, mount_stages = _guard_mount(Mount.parse(value), line, context, keys, stage_names, counter)
        kept.append(f"--mount={mount}")
        stages += mount_stages
    if kept == list(instruction.flags):
        return None, []
    return _emitted("RUN", kept, instruction.words, line, json_form=instruction.json), stages


def _guard_mount(mount: Mount, line: int, context: Path, keys: _Keys, stage_names: Sequence[str], counter: Iterator[int]) -> tuple[str, list[str]]:
    """A ``--mount`` spec made safe (see the module docstring), and the scratch stage it now mounts from."""
    if '"' in mount.spec or "'" in mount.spec:
        raise UnsafeDockerfileError(f"line {line}: RUN --mount={mount.spec}: builders read quotes inside a mount's options differently; write them unquoted.")
    if mount.kind not in ("bind", "cache"):
        return mount.spec, []
    changes: dict[str, str | None] = {}
    if mount.kind == "cache":
        named = mount.options.get("id") or mount.options.get("target") or mount.options.get("dst", "")
        if ".." in named.split("/"):
            # buildah 1.39 made a folder outside its cache area for target=/../../../e (a red-team finding).
            raise UnsafeDockerfileError(f"line {line}: RUN --mount={mount.spec}: a cache's id or target may not contain '..'; name it plainly.")
        changes["id"] = f"{PREFIX}-{keys.cache}-{named}"
    if "from" not in mount.options:
        if mount.kind == "bind":
            _check_context_source(mount.source or ".", context, line)
        return mount.replaced(**changes) if changes else mount.spec, []
    source = mount.source or "/"
    if not _PLAIN_PATH.fullmatch(source):
        raise UnsafeDockerfileError(f"line {line}: RUN --mount source {source!r}: write a mount's source as a plain path (letters, digits, ./@+-_).")
    origin = mount.options["from"]
    origin = stage_names[int(origin)] if origin.isdigit() and int(origin) < len(stage_names) else origin
    # Named by the image's content: the same RUN text in another task's build mounts another stage.
    stage = f"{PREFIX}-mount-{keys.image}-{next(counter)}"
    copy = _emitted("COPY", [f"--from={origin}"], [source, "/mounted"], line)
    return mount.replaced(**changes, **{"from": stage, "source": "/mounted", "src": None}), [f"FROM scratch AS {stage}", copy]


def _emitted(keyword: str, flags: Sequence[str], words: Sequence[str], line: int, *, json_form: bool = False) -> str:
    try:
        return emit(keyword, flags, words, json_form=json_form)
    except ValueError as error:
        raise UnsafeDockerfileError(f"line {line}: {error}") from None


def _check_context_source(source: str, context: Path, line: int) -> None:
    root = os.path.realpath(context)
    resolved = os.path.realpath(os.path.join(root, source.lstrip("/")))
    if resolved != root and not resolved.startswith(root + os.sep):
        raise UnsafeDockerfileError(
            f"line {line}: RUN --mount source {source!r} resolves outside the build context ({resolved}); mount a plain file or folder of the task's environment folder."
        )


def _guard_add(instruction: Instruction, line: int, guarded: Guarded, counter: Iterator[int], escape: str) -> str | None:
    """An ``ADD`` of URLs as a ``COPY`` from a context holding their downloads; other ``ADD`` lines as they are.

    Each source is read as the builder reads it (quotes removed, escapes resolved), so that
    ``ADD "http://..."`` and ``ADD http\\://...`` are the URLs they are to the builder.
    """
    written, destination = list(instruction.words[:-1]), instruction.words[-1] if instruction.words else ""
    _refuse_variable_sources(written, line)
    sources = [shell_word(word, escape).strip() for word in written]
    remote = [_is_remote(source, line) for source in sources]
    if not any(remote):
        return None
    if instruction.json:
        raise UnsafeDockerfileError(f'line {line}: ADD ["<url>", ...] (JSON form) with a URL; write it as ADD <url> <destination>.')
    if not all(remote):
        raise UnsafeDockerfileError(f"line {line}: ADD mixes URLs and local files; give the URLs an ADD line of their own.")
    if len(sources) > 1 and not shell_word(destination, escape).endswith("/"):
        raise UnsafeDockerfileError(f"line {line}: ADD of several URLs needs a destination folder ending in '/'.")
    context = f"{PREFIX}-add-{next(counter)}"
    names: list[str] = []
    for number, url in enumerate(sources):
        name = url_file_name(url)
        name = name if name and name not in names else f"download-{number}"
        guarded.downloads.append((context, name, url))
        names.append(name)
    return _emitted("COPY", [f"--from={context}", *instruction.flags], [*names, destination], line)


def _is_remote(source: str, line: int) -> bool:
    """Whether an ``ADD`` source is fetched by the builder: an http(s) URL (downloaded here instead); other remotes are refused."""
    if _GIT.search(source):
        raise UnsafeDockerfileError(
            f"line {line}: ADD {source}: a git repository, which the builder would clone from the host's own network; "
            "clone it in a RUN step (its network is the sandbox's), or ADD an archive's http(s) URL."
        )
    if (url := _URL.match(source)) and url["scheme"].lower() not in ("http", "https"):
        raise UnsafeDockerfileError(f"line {line}: ADD {source}: only http(s) URLs can be added; fetch it in a RUN step, or copy the file into the task's environment folder.")
    return url is not None


def _refuse_variable_sources(sources: list[str], line: int) -> None:
    """An ``ADD`` source named through ``$ARG`` or ``$ENV`` is only known once the builder fills it in, and
    a URL there would be fetched by the builder from the host's network: refused before the build."""
    if named := next((source for source in sources if "$" in source), None):
        raise UnsafeDockerfileError(
            f"line {line}: ADD {named}: a source named through a variable may be a URL, which the builder would fetch from "
            "the host's own network; write the source literally (an http(s) URL is then fetched from outside the host), or COPY a local file."
        )


def url_file_name(url: str) -> str:
    """The file name Docker gives a URL's download in a destination folder (the path's last part);
    empty when it has none, or none that is a plain file name."""
    path = url.split("?", 1)[0].split("#", 1)[0].split("://", 1)[-1]
    name = path.rsplit("/", 1)[-1] if "/" in path else ""
    return name if re.fullmatch(r"[\w.+-]+", name) and name not in (".", "..") else ""


def _name_every_stage(dockerfile: str) -> str:
    """Every stage named, and numeric ``COPY --from=N`` turned into those names, so that stages inserted
    before a stage do not shift what the numbers point at (a mount's ``from=N``: :func:`_guard_mount`)."""
    instructions = parse(dockerfile)
    froms = [instruction for instruction in instructions if instruction.keyword == "FROM"]
    names = [_stage_name(instruction) or f"{PREFIX}-stage-{n}" for n, instruction in enumerate(froms)]
    lines = physical_lines(dockerfile)
    for n, instruction in enumerate(froms):
        if not _stage_name(instruction):
            replace_instruction(lines, instruction, _emitted("FROM", instruction.flags, [*instruction.words, "AS", names[n]], instruction.start + 1))
    for instruction in instructions:
        if instruction.keyword == "COPY" and any(_numbered(flag, names) != flag for flag in instruction.flags):
            flags = [_numbered(flag, names) for flag in instruction.flags]
            replace_instruction(lines, instruction, _emitted("COPY", flags, instruction.words, instruction.start + 1, json_form=instruction.json))
    return joined(lines)


def _numbered(flag: str, names: Sequence[str]) -> str:
    """``--from=N`` as ``--from=<name of stage N>``; other flags as they are."""
    name, _, value = flag.partition("=")
    return f"{name}={names[int(value)]}" if name.lower() == "--from" and value.isdigit() and int(value) < len(names) else flag
