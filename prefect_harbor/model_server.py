"""Moved to :mod:`prefect_harbor.testing.model_server`: it is a test double, not part of the core.

This alias keeps ``import prefect_harbor.model_server`` and ``python -m prefect_harbor.model_server``
(the README's command before the move) working; new code should use the testing path.
"""

import sys

from prefect_harbor.testing.model_server import *  # noqa: F403  (the alias re-exports it whole)
from prefect_harbor.testing.model_server import main

if __name__ == "__main__":
    sys.exit(main())
