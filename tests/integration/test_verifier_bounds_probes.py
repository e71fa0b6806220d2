"""Issue 28's bounds through the real sweep: probe tasks whose verifier (or agent) writes what
broke a sweep on main, each now a clear outcome with nothing lost.

* a 400 MB ``reward.json`` (on main: an err_message of 400 million characters and a sweep of
  3.3-4.9 GB RSS) is a verifier_error naming the 1 MiB bound, a message of a few KiB, and the
  sweep grows by less than 300 MiB of RSS while it runs;
* a 300,000-key ``reward.json`` (on main: accepted, a 6.7 MB rewards cell) is refused;
* ``{"reward": 1e308}`` (on main: accepted, the mean 5.6e306) is refused by ``reward_range``;
* a 250-character file name in ``/logs`` (on main: the archive push failed, the archive stayed
  in ``_unsent``, the row counted as success) is archived under a shorter name, the original in
  the manifest;
* a file over the copy limit followed by many files (on main: the files behind it dropped
  without a count) keeps the files behind it and counts what it dropped.
"""

from __future__ import annotations

import json
import resource
import threading
from pathlib import Path

import pytest
from tasks_factory import write_task
from test_verifier_tampering import sweep

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_server")]

LONG_NAME = "n" * 250
SMALL_FILES = 500
PROBES = {
    "huge-reward-json": ("true", "{ head -c 400000000 /dev/zero | tr '\\0' ' '; echo '{\"reward\": 1}'; } > /logs/verifier/reward.json"),
    "many-keys": ("true", "python3 -c \"import json; json.dump({'reward': 1, **{f'k{n}': 1 for n in range(300000)}}, open('/logs/verifier/reward.json', 'w'))\""),
    "huge-reward": ("true", "echo '{\"reward\": 1e308}' > /logs/verifier/reward.json"),
    "long-file-name": (f"mkdir -p /logs/agent && echo hi > /logs/agent/{LONG_NAME}", "echo 1 > /logs/verifier/reward.txt"),
}
#: Copied out under a 4 MiB max_copy_mb: an 8 MiB file, then many small ones.
BIG_THEN_MANY = (
    f"mkdir -p /logs/agent && head -c 8388608 /dev/zero > /logs/agent/big && for i in $(seq {SMALL_FILES}); do echo $i > /logs/agent/small-$i; done",
    "echo 1 > /logs/verifier/reward.txt",
)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict], Path, float]:
    """The probes' rows, their folder, and how far the process's RSS rose above where it was while they ran."""
    tmp_path = tmp_path_factory.mktemp("bounds")
    for name, (solve, test) in PROBES.items():
        write_task(tmp_path / "tasks", name, solve=solve, test=test)
    with RssWatch() as watch:
        rows = sweep(tmp_path, list(PROBES), reward_range=[0, 1])
    return rows, tmp_path, watch.growth_mib


def rss_mib() -> float:
    """This process's resident memory now (not its peak: earlier tests in the same worker set that)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


class RssWatch:
    """The highest RSS seen every 20 ms while the block runs, less the RSS at its start."""

    def __enter__(self) -> RssWatch:
        self.start, self.peak, self._done = rss_mib(), rss_mib(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self.peak = max(self.peak, rss_mib())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    @property
    def growth_mib(self) -> float:
        return self.peak - self.start


def test_a_400_mb_reward_json_is_a_verifier_error_of_a_few_kib_and_the_sweep_stays_small(bounded):
    row = bounded[0]["huge-reward-json"]
    assert bounded[2] < 300, f"the sweep's process grew by {bounded[2]:.0f} MiB while it read a 400 MB reward.json"
    assert (row["status"], row["err_category"], row["reward"]) == ("failure", "verifier_error", None)
    assert "1,048,576" in row["err_message"] and len(row["err_message"]) < 5000, row["err_message"][:500]


def test_a_300000_key_reward_json_is_refused(bounded):
    row = bounded[0]["many-keys"]
    assert (row["status"], row["err_category"], row["reward"]) == ("failure", "verifier_error", None), row["err_message"]
    assert not row["rewards"] and "verifier/reward.json is" in row["err_message"] and len(row["err_message"]) < 5000


def test_a_reward_of_1e308_is_outside_the_reward_range_and_the_mean_stays_sane(bounded):
    rows, _, _ = bounded
    assert (rows["huge-reward"]["status"], rows["huge-reward"]["err_category"], rows["huge-reward"]["reward"]) == ("failure", "verifier_error", None)
    assert "reward_range" in rows["huge-reward"]["err_message"], rows["huge-reward"]["err_message"]
    # The three verifiers that broke share the agent's sandbox: by the scoring contract each counts as 0, never as 1e308.
    assert (rows["summary"]["mean_reward"], rows["summary"]["agent_failures"]) == (0.25, 3), rows["summary"]


def test_a_250_character_file_name_is_archived_under_a_shorter_name_and_nothing_stays_unsent(bounded):
    rows, tmp_path, _ = bounded
    assert (rows["long-file-name"]["status"], rows["long-file-name"]["reward"], rows["long-file-name"]["archive_error"]) == ("success", 1.0, None)
    manifest = next((tmp_path / "results").rglob("long-file-name*/manifest.json"))
    originals = [entry["original"] for entry in json.loads(manifest.read_text())["files"] if "original" in entry]
    assert any(original.endswith(LONG_NAME) for original in originals), originals
    assert not [p for p in (tmp_path / "trials").rglob("_unsent/**/*") if p.is_file()]


def test_a_file_over_the_copy_limit_keeps_the_files_behind_it_and_counts_what_it_dropped(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("big-then-many")
    write_task(tmp_path / "tasks", "big-then-many", solve=BIG_THEN_MANY[0], test=BIG_THEN_MANY[1])
    rows = sweep(tmp_path, ["big-then-many"], environment={"kwargs": {"max_copy_mb": 4}})
    assert (rows["big-then-many"]["status"], rows["big-then-many"]["reward"]) == ("success", 1.0), rows["big-then-many"]["err_message"]
    (report,) = (tmp_path / "trials").rglob("sandbox/*.json")
    cut = [entry for entry in json.loads(report.read_text())["copies_cut"] if "agent" in entry["source"]]
    assert cut and cut[0]["dropped_files"] >= 1 and cut[0]["dropped_bytes"] >= 8388608, cut
    kept = list((report.parent.parent / "agent").glob("small-*"))
    assert len(kept) == SMALL_FILES, f"{len(kept)} of the small files landed"
