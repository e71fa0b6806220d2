"""A cancelled sweep's headline, kept on its flow run's final state after its runner has its say.

A sweep cancelled from the UI or ``prefect flow-run cancel`` stops its rows, records them and
ends in its own Cancelled state, whose message is the headline (``Sweep cancelled (…); 5 rows:
3 success, …``). When a runner launched it (``serve()``, a worker), that runner then waits for
the flow's process to exit and forces a Cancelled state of its own, *copied from the
Cancelling state it saw*, with the message "Flow run was cancelled successfully." (Prefect
3.9: ``runner/_cancellation_manager.py``, ``runner/_cancel_finalizer.py``): about 2-3 s later,
the headline is gone. The server cannot refuse that proposal (it is forced), and the runner
asks nobody first; the last thing it does before it is its ``on_cancellation`` hooks.

So the flow's hook, :func:`keep_the_headline`, starts a keeper of its own session (the hook
runs in the runner's process, or in a short-lived one the worker waits for) that waits for the
runner's state and sets the sweep's own back, once. The runner's state stays in the run's
history. Where no runner cancels a run (the CLI, ``evaluation_sweep()`` in Python), no hook runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from typing import Any
from uuid import UUID

#: How a sweep's own Cancelled state's message starts: how the keeper tells it from the runner's.
SWEEP_CANCELLED = "Sweep cancelled"
#: How long the keeper waits for the runner's state before giving up (the runner proposes it at once after the hooks).
KEEP_SECONDS = 60.0
POLL_SECONDS = 0.25

logger = logging.getLogger(__name__)


def keep_the_headline(flow: Any, flow_run: Any, state: Any) -> None:
    """``on_cancellation`` hook: start the keeper for this flow run, detached (its own session, no
    pipes), so neither a worker waiting for the hook's process nor one killing its group stops it."""
    subprocess.Popen(
        [sys.executable, "-m", "prefect_harbor.flows.headline", str(flow_run.id)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=os.environ.copy(),
    )  # fmt: skip


async def keep(flow_run_id: UUID, timeout: float = KEEP_SECONDS) -> bool:
    """Set the sweep's own final state back once a later Cancelled state replaced it; whether it did.

    Nothing is done when the sweep set no state of its own (killed before it could) or when the
    run moved on (a Retry runs it again)."""
    from prefect.client.orchestration import get_client
    from prefect.states import State

    async with get_client() as client:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            history = sorted(await client.read_flow_run_states(flow_run_id), key=lambda s: s.timestamp)
            own = own_final_state(history)
            if own is None:
                return False
            current = history[-1]
            if not current.is_cancelled():
                return False
            if current.id != own.id:
                restored = State(type=own.type, name=own.name, message=own.message, state_details=own.state_details)
                await client.set_flow_run_state(flow_run_id, restored, force=True)
                return True
            await asyncio.sleep(POLL_SECONDS)
    return False


def own_final_state(history: list[Any]) -> Any | None:
    """The Cancelled state the sweep set itself since it last started running, if any."""
    for state in reversed(history):
        if state.is_running():
            return None
        if state.is_cancelled() and (state.message or "").startswith(SWEEP_CANCELLED):
            return state
    return None


def main(argv: list[str]) -> int:
    """``python -m prefect_harbor.flows.headline FLOW_RUN_ID``: the keeper, as the hook starts it."""
    try:
        asyncio.run(keep(UUID(argv[0])))
    except Exception:  # the run's record stands either way; a keeper has no one to tell
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
