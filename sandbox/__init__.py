"""A Docker-free Harbor environment: one bubblewrap sandbox per trial."""

from prefect_harbor.sandbox.bubblewrap import IMPORT_PATH, BubblewrapEnvironment
from prefect_harbor.sandbox.dockerfile import UnsupportedDockerfileError

__all__ = ["IMPORT_PATH", "BubblewrapEnvironment", "UnsupportedDockerfileError"]
