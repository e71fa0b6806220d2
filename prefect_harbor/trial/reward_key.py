"""Which of the verifier's keys is a row's reward: ``reward`` (Osmosis), one named key, or an aggregate.

Harbor tasks may write several keys (``{"correctness": 1, "performance": 0.5}``); Osmosis
counts only ``reward`` and that stays the default. For Harbor-native datasets the backend's
``reward_key`` names another key, or ``mean(a, b)`` / ``min(a, b)`` of named keys. Every key
is kept in the ``rewards`` column whichever is chosen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from statistics import fmean

from prefect_harbor.config import ConfigurationError

DEFAULT = "reward"
_KEY = r"[A-Za-z_][\w.-]*"
#: ``key`` or ``mean(key, key, ...)`` / ``min(key, ...)`` (the JSON schema's pattern too).
PATTERN = rf"^({_KEY}|(mean|min)\(\s*{_KEY}(\s*,\s*{_KEY})*\s*\))$"
_AGGREGATES: dict[str, Callable[[Sequence[float]], float]] = {"mean": fmean, "min": min}


def parse(spec: str) -> tuple[str | None, tuple[str, ...]]:
    """``("mean", ("a", "b"))`` for ``mean(a, b)``; ``(None, ("reward",))`` for a plain key."""
    if not re.fullmatch(PATTERN, spec.strip()):
        raise ConfigurationError(f"reward_key: {spec!r} is not a key or mean(k1, k2, ...) / min(k1, k2, ...) of keys; e.g. 'reward' or 'mean(correctness, performance)'.")
    spec = spec.strip()
    if "(" not in spec:
        return None, (spec,)
    name, inner = spec[:-1].split("(", 1)
    return name, tuple(key.strip() for key in inner.split(","))


def reward_of(rewards: dict[str, float], spec: str = DEFAULT) -> float | None:
    """The row's reward under ``spec``; None when a key it needs is missing."""
    aggregate, keys = parse(spec)
    if any(key not in rewards for key in keys):
        return None
    values = [rewards[key] for key in keys]
    return values[0] if aggregate is None else float(_AGGREGATES[aggregate](values))
