"""What a process pays to load the sweep, against loading Prefect alone, in the same minute.

Every CLI sweep, ``serve``, worker and deployment run (Prefect starts a process per flow run)
imports the flows before its first row. Each figure is a fresh interpreter, measured by wall
clock and its peak RSS, alternating the baseline and the subject:

    .venv/bin/python benchmarks/import_cost.py --repeats 5

Its last line reads ``ratio=<flows/prefect> overhead_ms=<flows-prefect> peak_rss_mb=<flows>
loaded_litellm=<True|False>``. Figures compare within one run only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROBE = """
import json, resource, sys, time
start = time.perf_counter()
import {module}
print(json.dumps({{"seconds": time.perf_counter() - start, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "litellm": "litellm" in sys.modules}}))
"""


def measure(module: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    baseline, subject = [], []
    for _ in range(args.repeats):  # alternated, so a busy moment costs both alike
        baseline.append(measure("prefect"))
        subject.append(measure("prefect_harbor.flows"))
    prefect_s = statistics.median(r["seconds"] for r in baseline)
    flows_s = statistics.median(r["seconds"] for r in subject)
    rss = statistics.median(r["rss_mb"] for r in subject)
    print(f"import prefect: {prefect_s:.2f} s median; import prefect_harbor.flows: {flows_s:.2f} s median, {rss:.0f} MB peak RSS")
    print(f"ratio={flows_s / prefect_s:.2f} overhead_ms={(flows_s - prefect_s) * 1000:.0f} peak_rss_mb={rss:.0f} loaded_litellm={subject[-1]['litellm']}")


if __name__ == "__main__":
    main()
