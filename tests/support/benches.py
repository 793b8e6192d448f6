"""Runs a script under bench/ the way a reader of its docstring would, for the tests that keep
the benchmarks working (their figures are for people to read; the tests check their shape),
or loads it, for a test that runs its core with its own settings."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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


def load_bench(script: str) -> ModuleType:
    """bench/<script> as a module, for a test that calls its functions (it imports only the
    installed packages, never tests/)."""
    name = f"bench_{Path(script).stem}"
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
