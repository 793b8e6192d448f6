"""The operator (`dsv4 run`) as a child process against a dev control plane: the one launcher
that the demo, the benchmarks and the integration tests start it with.

    with OperatorProcess(cp.kubeconfig_path, "my-namespace", log_dir) as operator:
        operator.settled()                        # two reconcile passes that write nothing
        operator.metric("dsv4_reconciles_total")  # read from its /metrics

It waits until the operator serves /metrics before it returns from `start()`; its counters
(reconcile passes, API writes) are what the waits here count, not seconds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from prometheus_client.parser import text_string_to_metric_families

from dsv4_devcluster.process import free_port, wait_for


class OperatorProcess:
    """`dsv4 run` as a subprocess watching one namespace ("" for all); logs go to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_dir: Path | None,
        *,
        wrap: Callable[[list[str]], list[str]] | None = None,
        **env: str,
    ) -> None:
        """`log_dir` None: the operator writes to this process's stdout and stderr. `wrap`
        turns the argv into the one to run (a pod's network namespace, say). `env` adds to
        or overrides the operator's settings (`DSV4_*`)."""
        self.kubeconfig, self.namespace, self.wrap = kubeconfig, namespace, wrap
        self.metrics_port = int(env.get("DSV4_METRICS_PORT") or free_port())
        self.log_path = (
            log_dir / f"operator-{namespace}-{time.monotonic_ns()}.log"
            if log_dir is not None
            else None
        )
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "DSV4_NAMESPACES": namespace,
            "DSV4_RESYNC_SECONDS": "2",
            "DSV4_METRICS_PORT": str(self.metrics_port),
            "DSV4_HEALTH_PORT": "0",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        listen = self.env.get("DSV4_LISTEN_HOST", "0.0.0.0")
        self.host = "127.0.0.1" if listen in ("0.0.0.0", "::") else listen

    def start(self) -> OperatorProcess:
        """Start it and wait until it serves /metrics; raises if it exits first."""
        log = self.log_path.open("ab") if self.log_path is not None else None
        argv = [sys.executable, "-m", "dsv4_operator.cli", "run"]
        try:
            self.proc = subprocess.Popen(
                self.wrap(argv) if self.wrap else argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT if log is not None else None,
            )
        finally:
            if log is not None:
                log.close()  # the child holds its own copy
        wait_for(
            "operator metrics endpoint",
            lambda: self.metric("dsv4_reconciles_total") is not None or self.alive_or_raise(),
            timeout=60,
        )
        return self

    def alive_or_raise(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        return False

    def metric(self, name: str, **labels: str) -> float | None:
        """Sum of the samples named `name` whose labels include `labels`, or None when the
        endpoint is not up."""
        try:
            with urllib.request.urlopen(
                f"http://{self.host}:{self.metrics_port}/metrics", timeout=5
            ) as resp:
                text = resp.read().decode()
        except OSError:
            return None
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def passes(self) -> float:
        """Reconcile passes finished so far (0 while the endpoint is not up)."""
        return self.metric("dsv4_reconciles_total") or 0

    def more_passes(self, count: int, timeout: float = 60) -> None:
        """Until the operator has finished `count` more reconcile passes."""
        target = self.passes() + count
        wait_for(f"{count} more reconcile passes", lambda: self.passes() >= target, timeout)

    def settled(self, writes: Callable[[], object] | None = None, timeout: float = 120) -> None:
        """Until two reconcile passes in a row finish with no API write (or no change in
        `writes()`, the writes that matter to the test): what the last change made the
        operator write (status, Events) has landed. Counted in passes, not seconds: a slow
        machine waits longer, a stalled operator fails here."""
        count = writes or (lambda: self.metric("dsv4_api_writes_total"))

        def quiet() -> bool:
            before = count()
            self.more_passes(2)
            return count() == before

        wait_for("two reconcile passes in a row that write nothing", quiet, timeout)

    def series(self, name: str) -> list[dict[str, str]]:
        """The label sets of the samples named `name` the operator exports now."""
        with urllib.request.urlopen(
            f"http://{self.host}:{self.metrics_port}/metrics", timeout=5
        ) as resp:
            text = resp.read().decode()
        return [
            dict(sample.labels)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def kill(self) -> None:
        """SIGKILL: no cleanup, the way a node loss or OOM kill ends it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        """Everything the operator logged so far ("" when its output went to the terminal)."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        if self.log_path is None:
            return "(the operator's output went to this process's terminal)"
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> OperatorProcess:
        return self.start() if self.proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def webhook_operator(
    kubeconfig: Path, namespace: str, log_dir: Path, **env: str
) -> OperatorProcess:
    """An operator serving the admission webhook on loopback; kopf keeps the
    ValidatingWebhookConfiguration `dsv4.io.validation` pointing at it (delete it after).
    `env` as for `OperatorProcess`."""
    return OperatorProcess(
        kubeconfig,
        namespace,
        log_dir,
        wrap=None,
        DSV4_WEBHOOK="1",
        DSV4_LISTEN_HOST="127.0.0.1",
        DSV4_WEBHOOK_PORT=str(free_port()),
        DSV4_WEBHOOK_URL_HOST="127.0.0.1",
        **env,
    ).start()
