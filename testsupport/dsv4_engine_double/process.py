"""Run the engine test double as a child process, the way a kubelet runs an engine container.

    with DoubleProcess(["--served-model-name", "dsv4", "--enable-metrics"],
                       {"SGLANG_DSV4_BF16_INDEX_K": "0"}) as double:
        httpx.get(double.url + "/health")

The argv is sglang's (the operator's rendered command after `python3 -m sglang.launch_server`);
`--host 127.0.0.1 --port 0` are appended unless `bind=False` (argparse keeps the last value, so
a rendered `--host 0.0.0.0 --port 30000` is overridden). The child's env is the parent's without
any `SGLANG_*` / `DSV4_DOUBLE_*` variable, plus `env`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from dsv4_operator.names import SGLANG_VERSION_ANNOTATION

_LISTENING = re.compile(r"Uvicorn running on http://([^:\s]+):(\d+)")


ENGINE_MODULE = "sglang.launch_server"


def launch_from_statefulset(
    statefulset: Mapping[str, Any], capabilities: Iterable[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """The engine argv (after `python3 -m sglang.launch_server`) and env of a rendered engine
    StatefulSet, plus `DSV4_DOUBLE_CAPABILITIES` (the image's capabilities, which the
    StatefulSet does not carry: pass the spec's `engine.capabilities`) and
    `DSV4_DOUBLE_SGLANG_VERSION` (the release the image carries: the StatefulSet's
    `dsv4.io/sglang-version` annotation, so the double answers as that release)."""
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    container = next((c for c in containers if c.get("name") == "engine"), containers[0])
    command = [*container.get("command", []), *container.get("args", [])]
    if ENGINE_MODULE not in command:
        raise ValueError(f"not an engine container: {command[:3]}")
    args = command[command.index(ENGINE_MODULE) + 1 :]
    env = {e["name"]: str(e.get("value", "")) for e in container.get("env", []) if "name" in e}
    env["DSV4_DOUBLE_CAPABILITIES"] = ",".join(capabilities)
    release = (statefulset["metadata"].get("annotations") or {}).get(SGLANG_VERSION_ANNOTATION)
    if release:
        env["DSV4_DOUBLE_SGLANG_VERSION"] = release
    return args, env


class DoubleFailedToStart(RuntimeError):
    """The double exited (or stayed silent) before it listened; `log` holds its stderr."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n--- engine double log ---\n{log}")
        self.log = log


class DoubleProcess:
    """One engine double child process; stderr is collected in the background."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        bind: bool = True,
    ) -> None:
        self.args = [*args, *(["--host", "127.0.0.1", "--port", "0"] if bind else [])]
        base = {
            k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "DSV4_DOUBLE_"))
        }
        self.env = {**base, **(env or {})}
        self.url = ""
        self._lines: list[str] = []
        self._listening = threading.Event()
        self._loading = threading.Event()
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    @property
    def process(self) -> subprocess.Popen[str]:
        if self._process is None:
            raise RuntimeError("the double has not been started")
        return self._process

    @property
    def log(self) -> str:
        return "".join(self._lines)

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._lines.append(line)
            if "Load weight begin" in line:
                self._loading.set()
            match = _LISTENING.search(line)
            if match and not self.url:
                host = "127.0.0.1" if match.group(1) in ("0.0.0.0", "") else match.group(1)
                self.url = f"http://{host}:{match.group(2)}"
                self._listening.set()
        self._listening.set()  # exited: unblock start()
        self._loading.set()

    def start(self, timeout: float = 20.0, *, loading: bool = False) -> DoubleProcess:
        """Start and wait until it listens (`loading`: until it is loading its weights, its
        port still closed: DSV4_DOUBLE_LOADING_S); raises DoubleFailedToStart if it does not."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "dsv4_engine_double", *self.args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if loading:
            if not self._loading.wait(timeout) or self.process.poll() is not None:
                self.stop()
                raise DoubleFailedToStart("the engine double did not start loading", self.log)
            return self
        if not self._listening.wait(timeout) or not self.url:
            self.stop()
            raise DoubleFailedToStart("the engine double did not start listening", self.log)
        return self

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for the process to exit; its return code (-9 after a simulated OOM)."""
        code = self.process.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        return code

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 5 s; the return code."""
        if self._process is None:
            return None
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(5)
        if self._reader is not None:
            self._reader.join(5)
        return self._process.returncode

    def __enter__(self) -> DoubleProcess:
        return self.start() if self._process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
