"""The playground's own parts on a real control plane: a claim of the default StorageClass gets
a hostPath volume that goes with it, a pod of a known image runs in a network namespace of its
own to completion, a pod of an unknown image is reported (never faked Running), and stopping
the playground leaves no namespace, host link, /etc/netns entry or directory behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dsv4_devcluster import wait_for
from dsv4_devcluster.netns import ETC_NETNS, PREFIX, namespaces
from dsv4_devcluster.playground import Playground
from dsv4_devcluster.playground_storage import STORAGE_CLASS

pytestmark = pytest.mark.integration


def _pod(name: str, image: str, args: list[str], claim: str = "") -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image, "args": args}
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if claim:
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        spec["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _ours() -> list[str]:
    return [n for n in namespaces() if n.startswith(f"{PREFIX}-{os.getpid()}-")]


@pytest.mark.long(seconds=20)
def test_the_playground_provisions_runs_known_images_reports_the_rest_and_cleans_up() -> None:
    lines: list[str] = []
    with Playground(say=lines.append) as pg:
        dyn = pg.cp.dynamic_client()
        claims = dyn.resources.get(api_version="v1", kind="PersistentVolumeClaim")
        volumes = dyn.resources.get(api_version="v1", kind="PersistentVolume")
        pods = dyn.resources.get(api_version="v1", kind="Pod")
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        claims.create(body=claim, namespace="default")

        def bound() -> dict[str, Any] | None:
            found: dict[str, Any] = claims.get(name="data", namespace="default").to_dict()
            return found if (found.get("status") or {}).get("phase") == "Bound" else None

        made = wait_for("the claim bound", bound, timeout=60)
        assert made["spec"]["storageClassName"] == STORAGE_CLASS  # the default class
        volume = volumes.get(name=made["spec"]["volumeName"]).to_dict()
        directory = Path(volume["spec"]["hostPath"]["path"])
        assert directory.is_dir() and directory.is_relative_to(pg.root)

        # The operator's image, any registry and tag: `dsv4 validate` on a file in the claim.
        example = Path(__file__).parents[2] / "examples" / "dsv4-sglang-0.5.23.yaml"
        (directory / "spec.yaml").write_text(example.read_text())
        image = "registry.example.com/dsv4-operator:0.1.0"
        pods.create(
            body=_pod("known", image, ["validate", "-f", "/data/spec.yaml"], claim="data"),
            namespace="default",
        )
        pods.create(body=_pod("unknown", "busybox:1.36", ["true"]), namespace="default")

        def phase(name: str) -> str | None:
            status = pods.get(name=name, namespace="default").to_dict().get("status") or {}
            return status.get("phase") if status.get("containerStatuses") else None

        assert wait_for(
            "the known pod ended", lambda: phase("known") in ("Succeeded", "Failed"), 60
        )
        known = pods.get(name="known", namespace="default").to_dict()
        assert known["status"]["phase"] == "Succeeded", (known["status"], lines)
        assert known["status"]["podIP"].startswith("198.1")  # 198.18.0.0/15: a pod network
        log = (pg.root / "pods" / "default_known" / "main.log").read_text()
        assert "dsv4-flash-upstream: valid" in log, log

        wait_for("the unknown pod reported", lambda: phase("unknown"), timeout=60)
        unknown = pods.get(name="unknown", namespace="default").to_dict()["status"]
        assert unknown["phase"] == "Pending"
        waiting = unknown["containerStatuses"][0]["state"]["waiting"]
        assert waiting["reason"] == "ImageNotInPlayground"
        assert "busybox:1.36" in waiting["message"]
        assert pg.runner is not None and "default/unknown" in pg.runner.unrunnable
        assert any(line.startswith("cannot run pod default/unknown") for line in lines), lines

        # The claim goes, and with it (reclaim policy Delete) its volume and directory.
        pods.delete(name="known", namespace="default")
        claims.delete(name="data", namespace="default")

        def volume_gone() -> bool:
            names = {v["metadata"]["name"] for v in volumes.get().to_dict()["items"]}
            return volume["metadata"]["name"] not in names and not directory.exists()

        wait_for("the released volume deleted", volume_gone, timeout=60)
        root = pg.root
        assert pg.network is not None
        tag = pg.network.tag
    assert not _ours(), _ours()
    assert not [p for p in Path(ETC_NETNS).glob(f"{PREFIX}-{os.getpid()}-*")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    assert f"d4h{tag}" not in links.stdout
    assert not root.exists()
