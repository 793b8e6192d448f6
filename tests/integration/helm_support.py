"""The real `helm` binary against the session's control plane, for the chart's integration tests."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..chart.support import CHART, helm_args, tool


class Helm:
    """The real helm binary against the session's API server (admin kubeconfig)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(tool("helm")), "--kubeconfig", str(self.kubeconfig), *map(str, args)]
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(map(str, args))}:\n{proc.stdout}{proc.stderr}")
        return proc

    def install(self, release: str, namespace: str, values: dict[str, Any], *extra: str) -> None:
        self("install", release, CHART, "--namespace", namespace, *helm_args(values), *extra)

    def uninstall(self, release: str, namespace: str) -> None:
        self("uninstall", release, "--namespace", namespace, "--wait", check=False)

    @contextlib.contextmanager
    def installed(self, release: str, namespace: str, values: dict[str, Any]) -> Iterator[None]:
        """The release installed for the block, uninstalled after it whatever happens."""
        self.install(release, namespace, values)
        try:
            yield
        finally:
            self.uninstall(release, namespace)
