"""The test tiers' walls: the fast tier is unit tests, and starts no container and no server."""

import os

import pytest

#: Set by scripts/dev.sh for the fast tier, which is unit tests: no container (``tests/unit_tier``
#: is first on its PATH, with a podman and a buildah that refuse), no server.
UNIT_TIER = os.environ.get("PREFECT_HARBOR_TEST_TIER") == "unit"


def refuse_in_the_unit_tier(what: str) -> None:
    """Fail a fast-tier test that starts ``what`` (a server): it belongs to the integration tier."""
    if UNIT_TIER:
        pytest.fail(f"the fast tier starts no server ({what}): mark the test integration (pytest.mark.integration)", pytrace=False)
