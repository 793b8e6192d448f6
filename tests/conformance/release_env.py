"""One cached CPU-only environment per supported SGLang release, and running a script of this
folder in it: `tools/conformance_env.py` builds (first run: minutes, several GB of wheels) or
reuses the release's environment; a failure to build it fails the test, it never skips it."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


class _Zygote:
    """A release's python with its heavy modules imported once (release_zygote.py), forking a
    child per script: one sglang import per release per test process, not one per question."""

    def __init__(self, version: str) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix=f"dsv4-sglang-{version}-"))
        self.proc = subprocess.Popen(
            [release_python(version), "-W", "ignore", str(HERE / "release_zygote.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(self.scratch / "zygote.log").open("w"),
            text=True,
            cwd=HERE,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        self.version = version
        self._read()  # {"ready": true} once the imports are done

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            log = (self.scratch / "zygote.log").read_text()[-3000:]
            pytest.fail(f"sglang {self.version}'s python exited:\n{log}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, argv: list[str], stdin: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """`python -W ignore *argv` in the release, run in HERE, with `stdin` as its stdin."""
        files = {name: self.scratch / name for name in ("stdin", "stdout", "stderr")}
        files["stdin"].write_text(stdin)
        for name in ("stdout", "stderr"):
            files[name].write_text("")
        assert self.proc.stdin is not None
        request = {"argv": argv, "cwd": str(HERE), "timeout": timeout}
        self.proc.stdin.write(json.dumps(request | {k: str(v) for k, v in files.items()}) + "\n")
        self.proc.stdin.flush()
        code = int(self._read()["returncode"])
        return subprocess.CompletedProcess(
            argv, code, files["stdout"].read_text(), files["stderr"].read_text()
        )

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.scratch, ignore_errors=True)


_zygotes: dict[str, _Zygote] = {}


def _zygote(version: str) -> _Zygote:
    if version not in _zygotes:
        _zygotes[version] = _Zygote(version)
    return _zygotes[version]


@atexit.register
def _close_zygotes() -> None:
    for zygote in _zygotes.values():
        zygote.close()


def run_in_release(version: str, script: Path, stdin: str = "", *args: str) -> str:
    """`script`'s stdout, run with the release's python (and its imports made once)."""
    proc = _zygote(version).run([str(script), *args], stdin, ASK_TIMEOUT_S)
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
    request = json.dumps({"cases": cases})
    script = str(HERE / "tool_call_check.py")
    if site is None:
        proc = _zygote(version).run([script], request, 600)
    else:  # the patched copy shadows the wheel's sglang: a python that has not imported it
        proc = subprocess.run(
            [release_python(version), "-W", "ignore", script],
            input=request,
            capture_output=True,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                "PYTHONPATH": str(site),
            },
            cwd=HERE,
            timeout=600,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer: dict[str, Any] = json.loads(proc.stdout)
    answer["log"] = proc.stderr
    return answer
