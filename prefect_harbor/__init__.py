"""prefect-harbor: agent evaluation sweeps as Prefect workflows on Harbor trials.

The import namespace gathers the repository's top-level folders: ``prefect_harbor.flows``
(flows/), ``.tasks`` (tasks/), ``.blocks`` (blocks/), ``.deployments`` (deployments/)
and ``.sandbox`` (sandbox/); this folder holds the core they share, by subject: ``.rows``,
``.trial``, ``.agents``, ``.storage``, ``.stats``, ``.cli`` and ``.testing`` (docs/architecture.md).
"""

import os

# Offline-safe defaults, set before harbor (and litellm through it) is imported:
# harbor's job telemetry and litellm's remote model-cost fetch both need the internet.
os.environ.setdefault("HARBOR_TELEMETRY", "0")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
