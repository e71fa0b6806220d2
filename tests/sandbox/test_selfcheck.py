"""The shared sandbox self-check suite, run against the container environment."""

import pytest
from harbor.models.task.config import NetworkMode

from prefect_harbor.sandbox.selfcheck import CHECKS, LIFECYCLE_CHECKS

#: Each test starts podman (builds, containers): the integration tier.
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", sorted(CHECKS))
async def test_self_check(name, environment):
    await CHECKS[name](environment)


async def test_no_network_is_enforced(make_environment):
    await LIFECYCLE_CHECKS["no_network_is_enforced"](make_environment(network_mode=NetworkMode.NO_NETWORK))


async def test_nothing_is_left_after_stop(make_environment):
    await LIFECYCLE_CHECKS["nothing_is_left_after_stop"](make_environment())
