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
  the image being built.
* ``ADD <url>``: buildah fetches the URL from the host, whose loopback holds the Prefect API.
  The URL is fetched here instead (:mod:`.remote_sources`), only from public addresses, and
  handed to the build as a file.

``RUN --network``/``--security`` flags (later builders' ways out of the build's network and
privileges) are refused, naming the line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from prefect_harbor.sandbox.dockerfile import logical_lines, parse_from_lines

#: The prefix of the stages and build contexts this module adds.
PREFIX = "prefect-harbor"
_RUN = re.compile(r"^(?P<indent>\s*)RUN(?P<flags>(?:\s+--\S+)*)(?P<command>\s.*)?$", re.IGNORECASE | re.DOTALL)
_ADD = re.compile(r"^\s*ADD\s", re.IGNORECASE)
_NUMERIC_FROM = re.compile(r"(--from=|\bfrom=)(\d+)\b", re.IGNORECASE)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


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
        return cls(options, order)

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


def guard(dockerfile: str, context: Path, image_key: str) -> Guarded:
    """``dockerfile`` (heredocs already lowered) rewritten as the module docstring says.

    ``image_key`` (the image's content digest) makes cache ids private; ``context`` is the
    build context that sources of context mounts must stay in. Raises
    :class:`UnsafeDockerfileError` for what cannot be made safe.
    """
    if needs_lowering(dockerfile):
        dockerfile = _name_every_stage(dockerfile)
    lines = dockerfile.splitlines()
    guarded = Guarded(text="")
    stage_starts = {line.index for line in parse_from_lines(dockerfile)}
    inserted: dict[int, list[str]] = {}  # physical line of a FROM -> scratch stages to put before it
    current_from = 0
    counter = iter(range(1_000_000))
    for start, end, instruction in logical_lines(dockerfile):
        if start in stage_starts:
            current_from = start
        if _ADD.match(instruction):
            replacement = _guard_add(instruction, start, guarded, counter)
        elif match := _RUN.match(instruction):
            replacement, stages = _guard_run(match, start, context, image_key, counter)
            inserted.setdefault(current_from, []).extend(stages)
        else:
            continue
        if replacement is not None:
            lines[start : end + 1] = [replacement] + [""] * (end - start)
    out: list[str] = []
    for index, line in enumerate(lines):
        out += inserted.get(index, [])
        out.append(line)
    guarded.text = "\n".join(out) + "\n"
    return guarded


def needs_lowering(dockerfile: str) -> bool:
    return any(
        (match := _RUN.match(instruction)) and any("from" in Mount.parse(spec).options for spec in _mount_specs(match["flags"]))
        for _, _, instruction in logical_lines(dockerfile)
    )


def _mount_specs(flags: str) -> list[str]:
    return [flag.split("=", 1)[1] for flag in flags.split() if flag.lower().startswith("--mount=")]


def _guard_run(match: re.Match[str], line: int, context: Path, image_key: str, counter) -> tuple[str | None, list[str]]:
    flags = match["flags"].split()
    if not flags:
        return None, []
    stages: list[str] = []
    kept: list[str] = []
    for flag in flags:
        name, _, value = flag.partition("=")
        if name.lower() in ("--network", "--security"):
            raise UnsafeDockerfileError(
                f"line {line + 1}: RUN {flag} would take the step out of the build's network or privileges; remove the flag "
                "(RUN steps reach the internet through the sandbox's own network)."
            )
        if name.lower() != "--mount":
            kept.append(flag)
            continue
        mount = Mount.parse(value)
        if mount.kind not in ("bind", "cache"):
            kept.append(flag)
            continue
        changes: dict[str, str | None] = {}
        if mount.kind == "cache":
            changes["id"] = f"{PREFIX}-{image_key}-{mount.options.get('id') or mount.options.get('target') or mount.options.get('dst', '')}"
        if "from" in mount.options:
            stage = f"{PREFIX}-mount-{next(counter)}"
            source = mount.source or "/"
            stages += [f"FROM scratch AS {stage}", f"COPY --from={mount.options['from']} {_quote_path(source)} /mounted"]
            changes |= {"from": stage, "source": "/mounted", "src": None}
        elif mount.kind == "bind":
            _check_context_source(mount.source or ".", context, line)
        kept.append(f"--mount={mount.replaced(**changes)}")
    return f"{match['indent']}RUN {' '.join(kept)}{match['command'] or ''}", stages


def _check_context_source(source: str, context: Path, line: int) -> None:
    root = os.path.realpath(context)
    resolved = os.path.realpath(os.path.join(root, source.lstrip("/")))
    if resolved != root and not resolved.startswith(root + os.sep):
        raise UnsafeDockerfileError(
            f"line {line + 1}: RUN --mount source {source!r} resolves outside the build context ({resolved}); "
            "mount a plain file or folder of the task's environment folder."
        )


def _quote_path(path: str) -> str:
    return path if re.fullmatch(r"[\w./@+-]+", path) else f'"{path}"'


def _guard_add(instruction: str, line: int, guarded: Guarded, counter) -> str | None:
    """An ``ADD`` of URLs as a ``COPY`` from a context holding their downloads; other ``ADD`` lines as they are."""
    words = instruction.split()[1:]
    flags = [word for word in words if word.startswith("--")]
    operands = [word for word in words if not word.startswith("--")]
    if operands and operands[0].startswith("["):  # JSON form
        parts = re.findall(r'"([^"]*)"', instruction)
        _refuse_variable_sources(parts[:-1], line)
        if any(_URL.match(part) for part in parts):
            raise UnsafeDockerfileError(f'line {line + 1}: ADD ["<url>", ...] (JSON form) with a URL; write it as ADD <url> <destination>.')
        return None
    sources, destination = operands[:-1], operands[-1] if operands else ""
    _refuse_variable_sources(sources, line)
    if not any(_URL.match(source) for source in sources):
        return None
    if not all(_URL.match(source) for source in sources):
        raise UnsafeDockerfileError(f"line {line + 1}: ADD mixes URLs and local files; give the URLs an ADD line of their own.")
    if len(sources) > 1 and not destination.endswith("/"):
        raise UnsafeDockerfileError(f"line {line + 1}: ADD of several URLs needs a destination folder ending in '/'.")
    context = f"{PREFIX}-add-{next(counter)}"
    names: list[str] = []
    for number, url in enumerate(sources):
        name = url_file_name(url)
        name = name if name and name not in names else f"download-{number}"
        guarded.downloads.append((context, name, url))
        names.append(name)
    return " ".join(["COPY", f"--from={context}", *flags, *names, destination])


def _refuse_variable_sources(sources: list[str], line: int) -> None:
    """An ``ADD`` source named through ``$ARG`` or ``$ENV`` is only known once the builder fills it in, and
    a URL there would be fetched by the builder from the host's network: refused before the build."""
    if named := next((source for source in sources if "$" in source), None):
        raise UnsafeDockerfileError(
            f"line {line + 1}: ADD {named}: a source named through a variable may be a URL, which the builder would fetch from "
            "the host's own network; write the source literally (an http(s) URL is then fetched from outside the host), or COPY a local file."
        )


def url_file_name(url: str) -> str:
    """The file name Docker gives a URL's download in a destination folder (the path's last part);
    empty when it has none, or none that is a plain file name."""
    path = url.split("?", 1)[0].split("#", 1)[0].split("://", 1)[-1]
    name = path.rsplit("/", 1)[-1] if "/" in path else ""
    return name if re.fullmatch(r"[\w.+-]+", name) and name not in (".", "..") else ""


def _name_every_stage(dockerfile: str) -> str:
    """Every stage named, and numeric stage references (``--from=0``, ``from=1``) turned into those names,
    so that stages inserted before a stage do not shift what the numbers point at."""
    froms = parse_from_lines(dockerfile)
    names = [line.stage or f"{PREFIX}-stage-{n}" for n, line in enumerate(froms)]
    lines = dockerfile.splitlines()
    for n, line in reversed(list(enumerate(froms))):
        if line.stage is None:
            lines[line.end] = lines[line.end].rstrip() + f" AS {names[n]}"
    renamed = "\n".join(lines) + "\n"
    return _NUMERIC_FROM.sub(lambda m: m.group(1) + (names[int(m.group(2))] if int(m.group(2)) < len(names) else m.group(2)), renamed)
