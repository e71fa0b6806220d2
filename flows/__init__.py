"""Prefect flows: the sweep and the steps users run on their own."""

from prefect_harbor.flows.sweep import evaluation_sweep

__all__ = ["evaluation_sweep"]
