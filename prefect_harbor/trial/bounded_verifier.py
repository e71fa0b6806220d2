"""Harbor's verifier, reading the reward files within bounds.

Harbor's ``Verifier`` reads ``reward.json`` (or ``reward.txt``) whole and quotes what it
refuses in its error: a 400 MB ``reward.json`` became a 400-million-character message in the
results, the archive and the logs, and took the sweep past 3 GB. This subclass, which every
trial runs (``TrialConfig.verifier.import_path``), refuses a reward file over
:data:`~prefect_harbor.bounds.REWARD_FILE_BYTES` before reading it and a ``reward.json`` of
more than :data:`~prefect_harbor.bounds.REWARD_KEYS` keys, each with an error that names the
file, the bound and the size; everything else is Harbor's.

Harbor passes ``skip_tests_upload`` (a separate verifier whose image brings its tests) only to
its own class, so it is worked out here as Harbor's trial does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, override

from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import VerifierEnvironmentMode, resolve_step_verifier_mode, resolve_task_verifier_mode, resolve_verifier_environment_definition
from harbor.verifier.verifier import Verifier, VerifierOutputParseError

from prefect_harbor.bounds import REWARD_FILE_BYTES, REWARD_KEYS

#: ``TrialConfig.verifier.import_path`` of this class.
IMPORT_PATH = "prefect_harbor.trial.bounded_verifier:BoundedVerifier"


class RewardFileTooLargeError(VerifierOutputParseError):
    """A reward file past the bounds a sweep reads."""


class BoundedVerifier(Verifier):
    """Harbor's :class:`~harbor.verifier.verifier.Verifier` with bounded reward files (module docstring)."""

    def __init__(self, *, task: Task, step_name: str | None = None, **kwargs: Any):
        super().__init__(task=task, step_name=step_name, skip_tests_upload=image_brings_tests(task, step_name), **kwargs)

    @override
    def _parse_reward_text(self) -> dict[str, float | int]:
        _check_size(self.trial_paths.reward_text_path)
        return super()._parse_reward_text()

    @override
    def _parse_reward_json(self) -> dict[str, float | int]:
        path = self.trial_paths.reward_json_path
        _check_size(path)
        try:
            document = json.loads(path.read_bytes())
        except ValueError:
            document = None  # Harbor's own message says so
        if isinstance(document, dict) and len(document) > REWARD_KEYS:
            raise RewardFileTooLargeError(
                f"verifier/reward.json holds {len(document):,} keys; a sweep reads at most {REWARD_KEYS:,} "
                "(write the reward and a few named scores, e.g. {\"reward\": 1.0})"
            )
        return super()._parse_reward_json()


def _check_size(path: Path) -> None:
    size = path.stat().st_size
    if size > REWARD_FILE_BYTES:
        raise RewardFileTooLargeError(
            f"verifier/{path.name} is {size:,} bytes; a sweep reads reward files of at most {REWARD_FILE_BYTES:,} bytes "
            "(write the reward and a few named scores, e.g. {\"reward\": 1.0})"
        )


def image_brings_tests(task: Task, step_name: str | None) -> bool:
    """Whether this verification runs in a separate verifier whose own image brings ``/tests``
    (Harbor's ``skip_tests_upload``), resolved as ``Trial._run_separate_verifier`` resolves it."""
    step = next((s for s in task.config.steps or [] if s.name == step_name), None) if step_name else None
    mode = resolve_step_verifier_mode(task.config, step) if step is not None else resolve_task_verifier_mode(task.config)
    if mode != VerifierEnvironmentMode.SEPARATE:
        return False
    definition = resolve_verifier_environment_definition(task.config, task.paths, step)
    return definition is not None and definition.bundled_tests
