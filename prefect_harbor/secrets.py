"""Secrets out of everything a sweep writes or logs: one :class:`Redactor` per run, used at every exit.

A row's strings come from inside its trial, which the agent controls: a verifier can write the
model key into ``reward.json`` and Harbor quotes it in an error message. So everything that
leaves a trial passes through the run's redactor before it is written, logged or published:

- result rows (``RowResult``), in the row's task run and again when the flow records them;
- archived files, their contents and their names (``storage/archive.py``);
- the manifest and the prewarm build logs;
- every log record while the flow runs (:func:`redacting_logs`, a filter on each handler,
  so Prefect's API handler, the console and any file handler see the redacted text).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from prefect_harbor.log_filters import on_every_handler

REDACTED = "[REDACTED]"
#: Shorter values are not secrets worth the name; Harbor's own masking shows 7 characters of a key.
MIN_SECRET_LENGTH = 8

SENSITIVE_KEYS = frozenset({"api_key", "apikey", "authorization", "credential", "credentials", "password", "secret", "token"})

Model = TypeVar("Model", bound=BaseModel)


def is_sensitive_key(key: str) -> bool:
    """Whether a mapping key names a credential (``api_key``, ``aws_secret``, ``password``…)."""
    normalized = key.lower().replace("-", "_")
    return normalized in SENSITIVE_KEYS or normalized.endswith(tuple(f"_{name}" for name in SENSITIVE_KEYS))


def secret_values(value: Any) -> list[str]:
    """Every string stored under a credential-bearing key, at any depth: what to scrub."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, child in value.items():
            if is_sensitive_key(str(key)) and isinstance(child, str) and child:
                found.append(child)
            else:
                found += secret_values(child)
    elif isinstance(value, list | tuple):
        for child in value:
            found += secret_values(child)
    return found


@dataclass(frozen=True)
class Redactor:
    """Replaces a run's secret values wherever they appear. Empty: every method is a no-op."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, values: Iterable[str]) -> Redactor:
        """Longest first, so a key is replaced whole before a shorter masked form of it.

        Values shorter than :data:`MIN_SECRET_LENGTH` are left out: replacing ``"s"`` (a test
        server's password) everywhere would garble every message and protect nothing.
        """
        return cls(tuple(sorted({value for value in values if len(value) >= MIN_SECRET_LENGTH}, key=len, reverse=True)))

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def needles(self) -> list[bytes]:
        return [secret.encode() for secret in self.secrets]

    def holds_secret(self, text: str) -> bool:
        return any(secret in text for secret in self.secrets)

    def text(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def strings(self, value: Any) -> Any:
        """Every string in ``value`` redacted, mapping keys included (a reward key can carry a key)."""
        if not self.secrets:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.strings(key): self.strings(child) for key, child in value.items()}
        if isinstance(value, list | tuple):
            return [self.strings(child) for child in value]
        return value

    def configuration(self, value: Any) -> Any:
        """Like :meth:`strings`, and credential-named keys blanked whatever they hold (the Osmosis rule)."""
        if isinstance(value, dict):
            return {key: REDACTED if is_sensitive_key(str(key)) else self.configuration(child) for key, child in value.items()}
        if isinstance(value, list | tuple):
            return [self.configuration(child) for child in value]
        return self.strings(value)

    def model(self, model: Model) -> Model:
        """``model`` with every string field redacted; the same object when it held no secret."""
        if not self.secrets:
            return model
        data = model.model_dump()
        cleaned = self.strings(data)
        return model if cleaned == data else type(model).model_validate(cleaned)


class RedactingFilter(logging.Filter):
    """Rewrites a record that holds a secret, before any handler formats or ships it."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.redactor.holds_secret(message):
            record.msg, record.args = self.redactor.text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and self.redactor.holds_secret(record.exc_text):
            record.exc_info, record.exc_text = None, self.redactor.text(record.exc_text)
        return True


@contextmanager
def redacting_logs(redactor: Redactor) -> Iterator[None]:
    """Redact every log record handled while the block runs, on every handler configured now (:func:`on_every_handler`)."""
    if not redactor:
        yield
        return
    with on_every_handler(RedactingFilter(redactor)):
        yield
