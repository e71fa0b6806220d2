"""Where the suite's time went, printed at the end of ``scripts/dev.sh test`` (and so of ``.ci/run``).

    python scripts/suite_report.py REPORT_DIR

``REPORT_DIR`` holds what the tiers left: ``walls`` (a ``name seconds`` line per step), a JUnit
file per pytest tier (``<tier>.xml``) and the fast tier's coverage data (``.coverage``). Prints
each step's wall, the 25 slowest tests of all tiers (setup, call and teardown together), and the
core's line coverage by the fast tier, as information: nothing here fails the run.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

SLOWEST = 25


def walls(report: Path) -> list[tuple[str, float]]:
    path = report / "walls"
    lines = path.read_text().split("\n") if path.is_file() else []
    return [(name, float(seconds)) for name, seconds in (line.rsplit(" ", 1) for line in lines if line.strip())]


def slowest(report: Path, count: int = SLOWEST) -> list[tuple[float, str, str]]:
    """(seconds, tier, test id) of the slowest tests in every tier's JUnit file."""
    cases = []
    for junit in sorted(report.glob("*.xml")):
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            cases.append((float(case.get("time") or 0), junit.stem, test_id))
    return sorted(cases, reverse=True)[:count]


def coverage_line(report: Path) -> str:
    data = report / ".coverage"
    if not data.is_file():
        return "core coverage: not measured (the fast tier did not finish)"
    import coverage

    measured = coverage.Coverage(data_file=str(data))
    measured.load()
    with open("/dev/null", "w") as quiet:
        total = measured.report(file=quiet)
    return f"core coverage by the fast tier (prefect_harbor, lines): {total:.1f}% (information, not a gate)"


def main() -> None:
    report = Path(sys.argv[1])
    print("\n==> Where the time went")
    for name, seconds in walls(report):
        print(f"  {name:<28} {seconds:7.0f} s")
    print(f"\n  slowest {SLOWEST} tests (setup + call + teardown):")
    for seconds, tier, test_id in slowest(report):
        print(f"  {seconds:7.1f} s  {tier:<12} {test_id}")
    print(f"\n  {coverage_line(report)}")


if __name__ == "__main__":
    main()
