"""Runs a script under bench/ the way a reader of its docstring would, for the tests that keep
the benchmarks working (their figures are for people to read; the tests check their shape)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO

BENCH = REPO / "bench"


def run_bench(script: str, *args: str, timeout: float = 600) -> str:
    """What `python bench/<script> <args>` printed; fails with its stderr if it exited non-zero."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"bench/{script} exited {done.returncode}:\n{done.stderr}"
    return done.stdout
