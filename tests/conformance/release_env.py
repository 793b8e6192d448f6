"""One cached CPU-only environment per supported SGLang release, and running a script of this
folder in it: `tools/conformance_env.py` builds (first run: minutes, several GB of wheels) or
reuses the release's environment; a failure to build it fails the test, it never skips it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsv4_operator.engine.releases import supported_versions

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL_DIR = HERE / "data" / "deepseek-v4-flash"


def model_dir(profile: str) -> Path:
    """The config.json folder of a model profile (data/<profile>; README.md there says where
    each number comes from)."""
    return HERE / "data" / profile


RELEASES = supported_versions()
BUILD_TIMEOUT_S = 45 * 60
ASK_TIMEOUT_S = 30 * 60

_pythons: dict[str, str] = {}


def release_python(version: str) -> str:
    """The python of `version`'s conformance environment (built once per session)."""
    if version not in _pythons:
        proc = subprocess.run(
            [sys.executable, str(REPO / "tools" / "conformance_env.py"), version],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(
                f"conformance env for sglang {version} could not be built:\n{proc.stderr[-3000:]}"
            )
        _pythons[version] = proc.stdout.strip().splitlines()[-1]
    return _pythons[version]


def run_in_release(version: str, script: Path, stdin: str = "", *args: str) -> str:
    proc = subprocess.run(
        [release_python(version), "-W", "ignore", str(script), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=ASK_TIMEOUT_S,
        cwd=HERE,
        check=False,
    )
    assert proc.returncode == 0, f"{script.name} failed in sglang {version}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def ask(version: str, request: dict[str, Any]) -> dict[str, Any]:
    """Send a request to release_check.py inside the release's environment."""
    answer: dict[str, Any] = json.loads(
        run_in_release(version, HERE / "release_check.py", json.dumps(request))
    )
    return answer


def parse_tool_calls(
    version: str, cases: list[dict[str, Any]], site: Path | None
) -> dict[str, Any]:
    """tool_call_check.py's answer for `cases` in `version`'s environment, on the wheel or, with
    `site`, on the patched copy of it there; `log` is what the run wrote to stderr."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [release_python(version), "-W", "ignore", str(HERE / "tool_call_check.py")],
        input=json.dumps({"cases": cases}),
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer: dict[str, Any] = json.loads(proc.stdout)
    answer["log"] = proc.stderr
    return answer
