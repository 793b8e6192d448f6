"""`dsv4 validate`, `dsv4 plan` and `dsv4 --help` import only what they use (their cold start).

Each runs in a fresh interpreter, as a user starts it, and reports the packages loaded once it
is done: the Kubernetes client, kopf, httpx and the rest belong to the commands that talk to a
cluster or an engine (`run`, `probe`, `selftest`, `tap`). The time itself is
`bench/cli_start.py`'s, not a test's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import EXAMPLE, REPO

# Packages a validation never needs; each costs tens of milliseconds to import.
NOT_FOR_VALIDATION = ("kubernetes", "kopf", "httpx", "prometheus_client", "aiohttp", "uvloop")

_RUN_AND_REPORT = """
import json, runpy, sys
sys.argv = ["dsv4", *json.loads(sys.argv[1])]
try:
    runpy.run_module("dsv4_operator.cli", run_name="__main__")
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _loaded(argv: list[str]) -> tuple[object, set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT, json.dumps(argv)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    return report["code"], set(report["modules"])


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_import_no_cluster_or_http_client(command: str) -> None:
    code, modules = _loaded([command, "-f", str(EXAMPLE)])
    assert code == 0
    assert "dsv4_operator" in modules  # the command ran in this interpreter
    assert modules.isdisjoint(NOT_FOR_VALIDATION), sorted(modules & set(NOT_FOR_VALIDATION))


def test_the_commands_imported_on_demand_still_run_and_list() -> None:
    """`probe` and `selftest` load when they run: `dsv4 --help` lists them without importing
    them (their summaries), their own `--help` runs."""
    code, modules = _loaded(["--help"])
    assert code == 0
    assert modules.isdisjoint(NOT_FOR_VALIDATION), sorted(modules & set(NOT_FOR_VALIDATION))
    listing = subprocess.run(
        [sys.executable, "-m", "dsv4_operator.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "  probe " in listing and "  selftest " in listing
    for command in ("probe", "selftest"):
        code, modules = _loaded([command, "--help"])
        assert code == 0
        assert "httpx" in modules or "kubernetes" in modules  # its own imports, now loaded
