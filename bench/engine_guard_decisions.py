"""How fast the guard decides on silent tool-call drops, end to end, over seeds.

Runs tests/integration/test_engine_guard_e2e.py's silent-drop test (real API server, the
operator, the engine double as SGLang 0.5.23 in place of each engine pod, `dsv4 tap` in front
of the decode engine, `tool_choice: auto` traffic from 4 clients) once per seed, each in its own
pytest process with `ENGINE_GUARD_E2E_SEED`, and prints per seed the seconds from the leaking decode
engine's start to the guard's Fail verdict, then the median, p90 and worst. The test itself
asserts the rollback and its reason; this script only collects the figure each run prints.

    .venv/bin/python bench/engine_guard_decisions.py --seeds 10
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = (
    "tests/integration/test_engine_guard_e2e.py"
    "::test_silent_tool_call_drops_roll_back_on_the_engines_own_count"
)
DECIDED = re.compile(r"seed (\d+): decided ([0-9.]+)s after")


def run(seed: int) -> float:
    """One run's decision time in seconds; raises if the test failed."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", TEST, "-p", "no:cacheprovider", "-q", "-s"],
        cwd=ROOT,
        env={**os.environ, "ENGINE_GUARD_E2E_SEED": str(seed)},
        capture_output=True,
        text=True,
        check=False,
    )
    found = DECIDED.search(proc.stdout)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"seed {seed}: the test failed (exit {proc.returncode}):\n{proc.stdout}")
    return float(found.group(2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="runs, seeds 0..N-1")
    args = parser.parse_args()
    times = []
    for seed in range(args.seeds):
        seconds = run(seed)
        times.append(seconds)
        print(f"seed {seed:2d}: decision {seconds:6.1f} s after onset", flush=True)
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    print(
        f"{len(times)} runs: median {statistics.median(times):.1f} s, p90 {p90:.1f} s, "
        f"worst {ordered[-1]:.1f} s"
    )


if __name__ == "__main__":
    main()
