"""Deployment definitions for the sweep: ``serve.py`` (``prefect-harbor serve``) and
``prefect.yaml`` (``prefect deploy`` to a process work pool)."""
