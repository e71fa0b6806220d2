"""The ``prefect-harbor`` command line and the checks ``prefect-harbor check`` runs (task preflight, the v0.2 API scan)."""
