"""Certifying tasks before they are used: is the reference solution always rewarded, and is
doing nothing never rewarded?

A task is certified for one content digest (Harbor's own, ``Packager.compute_content_hash``,
what a trial's lock records as the task's digest) after its oracle ran N times and Harbor's
``nop`` agent N times. The verdict holds until the task changes: a changed file is a new
digest with no certification. Verdicts, by the scoring contract (:mod:`prefect_harbor.scoring`):

* ``certified``: every oracle attempt was rewarded in full and no nop attempt was;
* ``trivial``: a nop attempt was rewarded in full (an agent doing nothing passes);
* ``broken``: no oracle attempt was rewarded in full;
* ``flaky``: some oracle attempts were rewarded in full and some not;
* ``unsettled``: an attempt was not scored (its sandbox, build or setup failed), so nothing
  can be said yet; certify again.

Certifications live beside the runs, one JSON file per digest under ``<results root>/certifications/``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from prefect_harbor.scoring import scoring_of
from prefect_harbor.storage.durable import DurableFolder

Verdict = Literal["certified", "trivial", "broken", "flaky", "unsettled"]
#: The folder under a results root that holds certifications (not a run: its name has no run id's shape).
CERTIFICATIONS = "certifications"
#: A reward counted as passing: Harbor's tasks reward a solved task with 1.0.
FULL_REWARD = 1.0
#: What to do about a task that is not certified, said wherever its rows are refused.
CERTIFY_FIX = (
    "certify its current content (prefect-harbor certify --tasks-dir DIR, into the same results storage; a task that fails "
    "certification must be fixed first) or turn off certified_tasks_only"
)


def task_digest(task_dir: Path) -> str:
    """Harbor's content digest of a task folder (``sha256:<hex>``), as a trial's lock records it."""
    from harbor.publisher.packager import Packager

    content_hash, _ = Packager.compute_content_hash(task_dir)
    return f"sha256:{content_hash}"


class Attempts(BaseModel):
    """One agent's attempts at a task, as the scoring contract counts them."""

    rewards: list[float] = Field(default_factory=list, description="Rewards of the scored attempts (an agent failure counts as 0).")
    not_scored: list[str] = Field(default_factory=list, description="Why each attempt that measured nothing was not scored (its cause).")

    @classmethod
    def of(cls, records: Iterable[Mapping[str, Any]]) -> Attempts:
        rewards, not_scored = [], []
        for record in records:
            scoring, cause = scoring_of(record)
            if scoring == "scored":
                rewards.append(float(record["reward"]))
            elif scoring == "agent_failure":
                rewards.append(0.0)
            elif scoring == "not_scored":
                not_scored.append(cause or "unknown")
            else:
                not_scored.append("cancelled")
        return cls(rewards=rewards, not_scored=not_scored)

    @property
    def passed(self) -> int:
        return sum(reward >= FULL_REWARD for reward in self.rewards)

    def phrase(self, agent: str) -> str:
        text = f"{agent} rewarded in full {self.passed} of {len(self.rewards)}"
        return text + (f" ({len(self.not_scored)} not scored: {', '.join(sorted(set(self.not_scored)))})" if self.not_scored else "")


class Certification(BaseModel):
    """What certifying one task's content found."""

    task: str
    digest: str = Field(description="Harbor's content digest of the task folder (sha256:<hex>).")
    verdict: Verdict
    reason: str = Field(description="The verdict in one sentence, with the counts.")
    oracle: Attempts
    nop: Attempts
    flake_rate: float | None = Field(description="The share of the oracle's scored attempts not rewarded in full; null when none was scored.")
    certified_at: datetime
    runs: list[str] = Field(default_factory=list, description="The sweeps' run folders that produced the attempts (oracle, then nop).")

    @property
    def label(self) -> str:
        """How a row names its task's certification: ``flaky (sha256:1a2b3c4d5e6f): oracle rewarded in full 2 of 3, ...``."""
        return f"{self.verdict} ({self.digest[:19]}): {self.reason}"


def judge(task: str, digest: str, oracle: Attempts, nop: Attempts, runs: list[str] | None = None) -> Certification:
    """The verdict on a task from its oracle's and its nop agent's attempts (see the module docstring)."""
    counts = f"{oracle.phrase('oracle')}; {nop.phrase('nop')}"
    verdict: Verdict
    if oracle.not_scored or nop.not_scored or not oracle.rewards or not nop.rewards:
        verdict, why = "unsettled", "some attempts measured nothing; certify again once they can run"
    elif nop.passed:
        verdict, why = "trivial", "an agent doing nothing is rewarded"
    elif oracle.passed == 0:
        verdict, why = "broken", "the reference solution is never rewarded"
    elif oracle.passed < len(oracle.rewards):
        verdict, why = "flaky", "the reference solution is rewarded only sometimes"
    else:
        verdict, why = "certified", "the reference solution is always rewarded and doing nothing never is"
    flake_rate = 1 - oracle.passed / len(oracle.rewards) if oracle.rewards else None
    return Certification(
        task=task, digest=digest, verdict=verdict, reason=f"{why} ({counts})", oracle=oracle, nop=nop, flake_rate=flake_rate,
        certified_at=datetime.now(UTC), runs=list(runs or []),
    )  # fmt: skip


class CertificationStore:
    """``<results root>/certifications/<digest hex>.json``, on any fsspec filesystem."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        fallback = Path(tempfile.gettempdir()) / "prefect-harbor" / "unsent" / CERTIFICATIONS
        self.folder = DurableFolder(root, CERTIFICATIONS, fallback_dir=fallback, storage_options=storage_options)

    @staticmethod
    def _name(digest: str) -> str:
        return f"{digest.removeprefix('sha256:')}.json"

    def exists(self) -> bool:
        """Whether anything was ever certified under this results root (one listing)."""
        return bool(self.folder.fs.exists(self.folder.run_path))

    def save(self, certification: Certification) -> str:
        """Write (or replace) the certification of its digest; its URI."""
        return self.folder.write_bytes(self._name(certification.digest), certification.model_dump_json(indent=2).encode())

    def load(self, digest: str) -> Certification | None:
        """The certification of ``digest``, or None when that content was never certified."""
        try:
            return Certification.model_validate_json(self.folder.read_bytes(self._name(digest)))
        except FileNotFoundError:
            return None

    def write_report(self, name: str, certifications: list[Certification]) -> str:
        """The table of one certify run, as a JSON file beside the certifications; its URI."""
        rows = [certification.model_dump(mode="json") for certification in certifications]
        return self.folder.write_bytes(f"reports/{name}.json", json.dumps(rows, indent=2).encode())


def table_rows(certifications: Iterable[Certification]) -> list[dict[str, Any]]:
    """One row per task for a table artifact and the console: verdict first."""
    return [
        {
            "task": c.task, "verdict": c.verdict, "oracle": f"{c.oracle.passed}/{len(c.oracle.rewards)}", "nop": f"{c.nop.passed}/{len(c.nop.rewards)}",
            "flake rate": "" if c.flake_rate is None else f"{c.flake_rate:.0%}", "not scored": len(c.oracle.not_scored) + len(c.nop.not_scored),
            "digest": c.digest[:19],
        }  # fmt: skip
        for c in certifications
    ]


class Gate(BaseModel):
    """What a sweep knows of its tasks' certifications: labels for the rows, and the tasks it may not run."""

    labels: dict[str, str] = Field(default_factory=dict, description="Task folder -> its certification's label.")
    refused: dict[str, str] = Field(default_factory=dict, description="Task folder -> why its rows are not run (certified tasks only).")


def gate(tasks: Mapping[str, Path], store: CertificationStore, certified_only: bool) -> Gate:
    """Look up each task's certification by its current digest (``tasks``: name -> folder).

    Nothing is read when nothing was ever certified and certification is not required."""
    result = Gate()
    if not certified_only and not store.exists():
        return result
    for name, folder in tasks.items():
        digest = task_digest(folder)
        found = store.load(digest)
        if found is not None:
            result.labels[str(folder)] = found.label
        if certified_only and (found is None or found.verdict != "certified"):
            why = f"its certification says {found.label}" if found is not None else f"its content ({digest[:19]}) was never certified"
            result.refused[str(folder)] = f"task {name} is not certified: {why}; {CERTIFY_FIX}"
    return result
