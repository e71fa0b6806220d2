"""The name this host goes by in the results (the ``host`` column) and in a shard's log.

``PREFECT_HARBOR_HOST`` when set: a worker's own name, for hosts whose hostnames repeat
(containers, cloned machines) or say nothing; else the hostname. Heartbeats keep the real
hostname: they tell a dead process from a live one only on the machine that ran it.
"""

from __future__ import annotations

import os
import socket

HOST_VARIABLE = "PREFECT_HARBOR_HOST"


def host_name() -> str:
    return os.environ.get(HOST_VARIABLE) or socket.gethostname()
