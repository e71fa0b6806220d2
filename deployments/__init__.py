"""Deployment definitions for the sweep (see docs/architecture.md)."""
