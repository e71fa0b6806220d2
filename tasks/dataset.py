"""The dataset pass that runs before any trial."""

from prefect import task
from prefect.cache_policies import NO_CACHE

from prefect_harbor.rows.dataset import DatasetInfo, scan_dataset


@task(name="inspect-dataset", retries=0, cache_policy=NO_CACHE)
def inspect_dataset(url: str) -> DatasetInfo:
    """Count the rows and fingerprint them; an unreadable file or duplicate ids fail the run here."""
    return scan_dataset(url)
