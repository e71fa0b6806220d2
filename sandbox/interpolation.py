"""``${VAR}`` in a task's docker-compose.yaml, read as compose reads it, from the variables the
backend passes through and nothing else of the host's.

Compose fills every ``$VAR``, ``${VAR}``, ``${VAR:-default}`` (default when unset or empty),
``${VAR-default}`` (default when unset), ``${VAR:?message}`` / ``${VAR?message}`` (stop when
unset), ``${VAR:+other}`` / ``${VAR+other}`` (``other`` when set) in the file's values from
the environment of whoever runs it, and an unset variable becomes an empty string with a
warning; ``$$`` is a literal ``$``. A task is someone else's data, so here the host's value is
given only for the variables listed in the backend's ``task_env_passthrough``, the list that
decides which host variables a task.toml's ``${VAR}`` may read
(:mod:`prefect_harbor.trial.task_env`): one policy for both files. Any other variable is
unset here, whatever the host holds, and a WARNING names it.

Harbor's own placeholders (``${CONTEXT_DIR}``, ``${MAIN_IMAGE_NAME}``, ``${CPUS}``, the log
paths, ...) keep their meaning: they are left in place for :mod:`.compose`, which reads them
where Harbor's templates put them, and ``${TEST_DIR}`` is the verifier's tests folder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The environment option (``EnvironmentConfig.kwargs``) carrying the backend's ``task_env_passthrough``.
PASSTHROUGH_OPTION = "task_env_passthrough"
#: What Harbor's docker environment defines for a compose file itself (``ComposeInfraEnvVars``,
#: its legacy log-mount variables), kept verbatim for :mod:`.compose`.
HARBOR_PLACEHOLDERS = re.compile(r"CONTEXT_DIR|MAIN_IMAGE_NAME|PREBUILT_IMAGE_NAME|CPUS|MEMORY|(HOST|ENV)_[A-Z_]+_PATH|EGRESS_CONTROL_[A-Z_]+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


class InterpolationError(ValueError):
    """A ``${...}`` compose would refuse too (malformed, or a required variable without a value)."""


@dataclass(frozen=True)
class ComposeVariables:
    """What a compose file's variables may be: the host's values of the passed-through ones."""

    passthrough: frozenset[str] = frozenset()
    values: Mapping[str, str] = field(default_factory=dict)
    #: Variables the host sets but the backend does not pass through (their values are never read).
    withheld: frozenset[str] = frozenset()

    @classmethod
    def from_host(cls, passthrough: Iterable[str] = ()) -> ComposeVariables:
        names = frozenset(passthrough)
        return cls(names, {name: os.environ[name] for name in names if name in os.environ}, frozenset(os.environ) - names)


@dataclass
class Interpolation:
    """Interpolates one compose file's values; :attr:`warnings` says which variables were not given, once each."""

    variables: ComposeVariables
    tests_dir: str
    warnings: dict[str, str] = field(default_factory=dict)

    def document(self, value: Any, where: str) -> Any:
        """Every string value of a YAML document interpolated (keys are not, as in compose)."""
        if isinstance(value, str):
            return self.text(value, where)
        if isinstance(value, dict):
            return {key: self.document(child, f"{where}.{key}" if where else str(key)) for key, child in value.items()}
        if isinstance(value, list):
            return [self.document(child, where) for child in value]
        return value

    def text(self, text: str, where: str) -> str:
        return interpolate(text, lambda name, fallback: self._lookup(name, fallback, where), where)

    def _lookup(self, name: str, fallback: bool, where: str) -> str | None:
        """The variable's value, or None when unset here. Warned about, as compose warns: an unset
        variable without a fallback (a default, ``:+``, ``:?``); and one the host sets but is withheld."""
        if HARBOR_PLACEHOLDERS.fullmatch(name):
            return f"${{{name}}}"
        if name == "TEST_DIR":
            return self.tests_dir
        if name in self.variables.values:
            return self.variables.values[name]
        if name in self.variables.withheld:
            reason = f"the host sets {name}, but the backend's task_env_passthrough does not list it, so tasks do not get it"
        elif fallback:
            return None
        elif name in self.variables.passthrough:
            reason = f"the backend's task_env_passthrough lists {name}, but this host does not set it"
        else:
            reason = f"this host does not set {name} (and a task's compose file may read only the variables in the backend's task_env_passthrough)"
        self.warnings.setdefault(name, f"{where}: ${{{name}}} is unset: {reason}; as compose does, its default is used, else an empty string.")
        return None


#: A variable's value (None: unset), told whether the text gives a fallback for it.
Lookup = Callable[[str, bool], str | None]


def interpolate(text: str, lookup: Lookup, where: str) -> str:
    """``text`` with compose's ``$`` forms filled by ``lookup``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        dollar = text.find("$", i)
        if dollar < 0:
            out.append(text[i:])
            break
        out.append(text[i:dollar])
        following = text[dollar + 1 : dollar + 2]
        if following == "$":
            out.append("$")
            i = dollar + 2
        elif following == "{":
            end = _closing_brace(text, dollar + 2, where)
            out.append(_braced(text[dollar + 2 : end], lookup, where))
            i = end + 1
        elif name := _NAME.match(text, dollar + 1):
            out.append(lookup(name.group(), False) or "")
            i = name.end()
        else:  # a lone '$' (as in 'cost $ 5'): compose keeps it
            out.append("$")
            i = dollar + 1
    return "".join(out)


def _closing_brace(text: str, start: int, where: str) -> int:
    """The index of the ``}`` closing the ``${`` whose body starts at ``start`` (bodies may nest ``${...}``)."""
    depth, i = 1, start
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
            continue
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise InterpolationError(f"{where}: {text!r} has a '${{' without its closing '}}'; write a literal '$' as '$$'.")


def _braced(body: str, lookup: Lookup, where: str) -> str:
    name = _NAME.match(body)
    if name is None:
        raise InterpolationError(f"{where}: '${{{body}}}' is not a variable compose can read; write a literal '$' as '$$'.")
    variable, rest = name.group(), body[name.end() :]
    if not rest:
        return lookup(variable, False) or ""
    operator = next((op for op in _OPERATORS if rest.startswith(op)), None)
    if operator is None:
        raise InterpolationError(f"{where}: '${{{body}}}' is not a compose variable form (${{VAR}}, ${{VAR:-default}}, ${{VAR-default}}, ...).")
    argument = rest[len(operator) :]
    value = lookup(variable, True)
    present = value is not None and (value != "" or ":" not in operator)
    if operator in (":-", "-"):
        return value if present else interpolate(argument, lookup, where)  # type: ignore[return-value]
    if operator in (":+", "+"):
        return interpolate(argument, lookup, where) if present else ""
    if not present:
        raise InterpolationError(
            f"{where}: ${{{variable}}} must be set ({argument or 'compose stops without it'}); list {variable} in the backend's "
            "task_env_passthrough and set it on the host running the sweep."
        )
    return value  # type: ignore[return-value]
