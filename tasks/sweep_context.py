"""What every attempt of one sweep shares, in the flow or on a worker: one object, built once per run.

It travels to a distributed runner's workers with each attempt, so everything in it pickles
without per-process state (the resolver and the store are built for that).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefect_harbor.rows.sources import TaskResolver
from prefect_harbor.secrets import Redactor
from prefect_harbor.spec import BackendSpec
from prefect_harbor.storage.run_store import RunStore
from prefect_harbor.trial.row_trial import RunContext


@dataclass(frozen=True)
class SweepContext:
    """The run's configuration, where its rows' tasks come from, its local directories, its store and the redactor of its secrets."""

    backend: BackendSpec
    resolver: TaskResolver
    run: RunContext
    store: RunStore
    redactor: Redactor
