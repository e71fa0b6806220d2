"""The ``prefect-harbor`` command line and the checks it runs (``check``, ``migrate-check``)."""
