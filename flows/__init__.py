"""Prefect flows: the sweep, task certification and the steps users run on their own.

``evaluation_sweep`` and ``certify_tasks`` are imported on first use, so a small module of this package (the
cancelled sweep's headline keeper, ``headline.py``) starts without importing Harbor.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prefect_harbor.flows.certify import certify_tasks
    from prefect_harbor.flows.sweep import evaluation_sweep

__all__ = ["certify_tasks", "evaluation_sweep"]


def __getattr__(name: str) -> Any:
    if name == "evaluation_sweep":
        from prefect_harbor.flows.sweep import evaluation_sweep

        return evaluation_sweep
    if name == "certify_tasks":
        from prefect_harbor.flows.certify import certify_tasks

        return certify_tasks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
