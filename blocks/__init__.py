"""Prefect Blocks holding the backend configuration, editable in the Prefect UI.

Registered through the ``prefect.collections`` entry point, or explicitly with
``prefect block register -m prefect_harbor.blocks``.
"""

from prefect_harbor.blocks.backend import HarborBackend
from prefect_harbor.blocks.endpoint import ModelEndpoint
from prefect_harbor.blocks.storage import ResultsStorage

__all__ = ["HarborBackend", "ModelEndpoint", "ResultsStorage"]
