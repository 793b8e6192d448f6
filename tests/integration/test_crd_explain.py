"""`kubectl explain` against the real API server shows each field's default: it prints the
OpenAPI description the API server publishes for the CRD, never the schema's `default`."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from dsv4_devcluster import ControlPlane, wait_for

from ..chart.support import tool

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("field", "default"),
    [
        ("spec.guard.canary.interval", "Default: 60s."),
        ("spec.model.cache.pvc.readOnly", "Default: true."),
        ("spec.engine.memFractionStatic", "Default: 0.85."),
    ],
)
def test_kubectl_explain_shows_the_default(
    control_plane: ControlPlane, dsv4_crd: dict[str, Any], field: str, default: str
) -> None:
    argv = [str(tool("kubectl")), "--kubeconfig", str(control_plane.kubeconfig_path)]
    argv += ["explain", f"dsv4deployments.{field}"]

    def explained() -> str | None:  # the CRD's OpenAPI is published shortly after it is served
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        return proc.stdout if proc.returncode == 0 else None

    text = " ".join(wait_for(f"kubectl explain {field}", explained, timeout=60).split())
    assert default in text, text
