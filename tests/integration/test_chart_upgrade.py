"""Upgrading the chart from 0.1.0 (CRD in crds/, installed once by Helm) to this chart (CRD as a
template, kept on uninstall), by the steps docs/install.md#upgrade gives, on a real API server.

The fixture `fixtures/dsv4-operator-0.1.0.tgz` is chart 0.1.0 as packaged by `helm package` at
commit 15bacf3, before the spec's bounds were added: its CRD differs from today's, so the test
sees the upgrade change the CRD.

A control plane of its own: the session's has the CRD installed by the harness, outside Helm.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_devcluster import ControlPlane
from dsv4_devcluster.deployments import example

from ..chart.support import CHART, tool

PREVIOUS = Path(__file__).parent / "fixtures" / "dsv4-operator-0.1.0.tgz"
CRD_NAME = "dsv4deployments.dsv4.io"
RELEASE, NAMESPACE = "dsv4-operator", "dsv4-system"


def _previous_crd() -> dict[str, Any]:
    with tarfile.open(PREVIOUS) as archive:
        member = archive.extractfile("dsv4-operator/crds/dsv4.io_dsv4deployments.yaml")
        assert member is not None
        crd: dict[str, Any] = yaml.safe_load(member.read())
    return crd


@pytest.fixture(scope="module")
def bare_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as cp:
        yield cp


def _run(cp: ControlPlane, name: str, *args: str, check: bool = True) -> str:
    proc = subprocess.run(
        [str(tool(name)), "--kubeconfig", str(cp.kubeconfig_path), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{name} {' '.join(args)}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def _engine_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    engine: dict[str, Any] = schema["properties"]["spec"]["properties"]["engine"]["properties"]
    return engine


def _holds(new: Any, old: Any) -> bool:
    """Whether `new` holds every field of `old` with the same value (and maybe more)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _holds(new[k], v) for k, v in old.items())
    return bool(new == old)


def _crd(cp: ControlPlane) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(_run(cp, "kubectl", "get", "crd", CRD_NAME, "-o", "json"))
    return got


def test_upgrade_from_0_1_0_adopts_and_upgrades_the_crd_and_keeps_it(
    bare_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = bare_plane
    new_crd = yaml.safe_load(
        (CHART / "files" / "crds" / "dsv4.io_dsv4deployments.yaml").read_text()
    )
    old_crd = _previous_crd()
    assert old_crd["spec"]["versions"] != new_crd["spec"]["versions"], "the fixture must differ"
    no_webhook = ["--set", "webhook.enabled=false"]  # no kubelet runs the webhook's pod here
    _run(
        cp,
        "helm",
        "install",
        RELEASE,
        str(PREVIOUS),
        "-n",
        NAMESPACE,
        "--create-namespace",
        *no_webhook,
    )
    assert _crd(cp)["spec"]["versions"][0]["schema"] == old_crd["spec"]["versions"][0]["schema"]

    # The survivor is what a user could write under 0.1.0: capabilities it did not know yet (the
    # example declares today's image) are left out.
    doc = example("default", name="survivor")
    doc["spec"]["decode"].pop("nodeSelector")
    doc["spec"]["prefill"].pop("nodeSelector")
    known = _engine_schema(old_crd)["capabilities"]["items"]["enum"]
    engine = doc["spec"]["engine"]
    engine["capabilities"] = [c for c in engine["capabilities"] if c in known]
    assert engine["capabilities"], "the survivor keeps some capability the old CRD knows"
    manifest = tmp_path / "survivor.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    _run(cp, "kubectl", "apply", "--server-side", "-f", str(manifest))
    before = json.loads(
        _run(cp, "kubectl", "get", "dsv4", "survivor", "-n", "default", "-o", "json")
    )

    # Without the adoption step Helm refuses to take over the CRD 0.1.0 left unowned.
    upgrade = ["upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reset-then-reuse-values"]
    refused = _run(cp, "helm", *upgrade, *no_webhook, check=False)
    assert "invalid ownership metadata" in refused, refused

    # docs/install.md#upgrade, "From chart 0.1.0".
    _run(cp, "kubectl", "label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")
    _run(
        cp,
        "kubectl",
        "annotate",
        "crd",
        CRD_NAME,
        f"meta.helm.sh/release-name={RELEASE}",
        f"meta.helm.sh/release-namespace={NAMESPACE}",
    )
    _run(cp, "helm", *upgrade, *no_webhook)
    upgraded = _crd(cp)
    assert upgraded["spec"]["versions"][0]["schema"] == new_crd["spec"]["versions"][0]["schema"]
    assert upgraded["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    after = json.loads(
        _run(cp, "kubectl", "get", "dsv4", "survivor", "-n", "default", "-o", "json")
    )
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    # Every field it had is unchanged; fields the new CRD added show with their defaults.
    assert _holds(after["spec"], before["spec"])

    # Uninstalling keeps the CRD and with it every DSV4Deployment.
    out = _run(cp, "helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    assert CRD_NAME in out  # helm reports the kept resource
    assert _crd(cp)["metadata"]["uid"] == upgraded["metadata"]["uid"]
    still = json.loads(
        _run(cp, "kubectl", "get", "dsv4", "survivor", "-n", "default", "-o", "json")
    )
    assert still["metadata"]["uid"] == before["metadata"]["uid"]
