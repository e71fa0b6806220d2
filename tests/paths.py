"""Where the bundled examples are, and what the oracle scores on them."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_TASKS = REPO / "examples" / "tasks"
EXAMPLE_DATASET = REPO / "examples" / "dataset.jsonl"
EXPECTED_ORACLE_REWARDS = {
    "multi-key-reward": 1.0,
    "reward-txt": 1.0,
    "broken-solution": 0.0,
    "background-process": 1.0,
    "no-network": 1.0,
    "verify-time-install": 1.0,
    "non-root-user": 1.0,
}

#: The example Osmosis v0.3 project (AgentWorkflow + Grader) and its tasks and datasets.
OSMOSIS_EXAMPLE = REPO / "examples" / "osmosis"
OSMOSIS_PROJECT = OSMOSIS_EXAMPLE / "arithmetic-agent"
