"""Prefect Blocks holding the backend configuration (see docs/architecture.md)."""
