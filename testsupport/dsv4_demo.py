"""`dsv4-demo` (`make demo`): the main job on one machine, end to end, on a real control plane.

Starts etcd + kube-apiserver + controller-manager + scheduler + kwok (fake GPU nodes), installs
the CRD, runs the operator (`dsv4 run`) as a child process, applies examples/dsv4.yaml, waits
until the engines are scheduled on GPU nodes of the right product and ready, prints the
DSV4Deployment and its children, and shuts everything down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from dsv4_devcluster import ControlPlane

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "dsv4.io_dsv4deployments.yaml"
EXAMPLE = REPO / "examples" / "dsv4.yaml"
GPU_NODES = (
    ("gpu-rtxpro-0", 8, "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"),
    ("gpu-rtxpro-1", 8, "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"),
    ("gpu-h100-0", 8, "NVIDIA-H100-80GB-HBM3"),
)


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def wait_until(what: str, check: Callable[[], Any], timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(1.0)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


@contextmanager
def operator_process(
    kubeconfig: Path, extra_env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`dsv4 run` as a child process against the given cluster; stopped on exit."""
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "DSV4_METRICS_PORT": "0",
        "DSV4_HEALTH_PORT": "0",
        "DSV4_RESYNC_SECONDS": "5",
        **(extra_env or {}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsv4_operator.cli", "run"],
        env=env,
        stdout=subprocess.DEVNULL if not os.environ.get("DSV4_DEMO_VERBOSE") else None,
        stderr=subprocess.STDOUT if not os.environ.get("DSV4_DEMO_VERBOSE") else None,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def show(dyn: Any, namespace: str, name: str) -> None:
    """Print `kubectl get dsv4` and the children, the way kubectl would."""
    obj = (
        dyn.resources.get(api_version="dsv4.io/v1alpha1", kind="DSV4Deployment")
        .get(name=name, namespace=namespace)
        .to_dict()
    )
    status = obj.get("status", {})
    roles = status.get("roles", {})
    print("\n$ kubectl get dsv4")
    print(
        _table(
            [
                ["NAME", "PHASE", "PREFILL", "DECODE", "REVISION", "LEAK"],
                [
                    name,
                    status.get("phase", ""),
                    str(roles.get("prefill", {}).get("ready", "")),
                    str(roles.get("decode", {}).get("ready", "")),
                    status.get("currentRevision", ""),
                    str(status.get("guard", {}).get("leakRate", "<none>")),
                ],
            ]
        )
    )
    print("\nconditions:")
    for c in status.get("conditions", []):
        print(f"  {c['type']:<12} {c['status']:<6} {c['reason']}: {c.get('message', '')}")
    print(
        "\n$ kubectl get statefulsets,deployments,services,pdb,controllerrevisions,pods "
        f"-l dsv4.io/deployment={name}"
    )
    rows = [["KIND", "NAME", "DETAIL"]]
    selector = f"dsv4.io/deployment={name}"
    for api_version, kind in (
        ("apps/v1", "StatefulSet"),
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("policy/v1", "PodDisruptionBudget"),
        ("apps/v1", "ControllerRevision"),
        ("v1", "Pod"),
    ):
        items = (
            dyn.resources.get(api_version=api_version, kind=kind)
            .get(namespace=namespace, label_selector=selector)
            .to_dict()["items"]
        )
        for item in items:
            detail = ""
            if kind == "Pod":
                detail = (
                    f"node={item['spec'].get('nodeName')} "
                    f"phase={item.get('status', {}).get('phase')}"
                )
            elif kind in ("StatefulSet", "Deployment"):
                st = item.get("status", {})
                detail = f"ready={st.get('readyReplicas', 0)}/{item['spec'].get('replicas')}"
            elif kind == "ControllerRevision":
                detail = f"revision={item.get('revision')}"
            rows.append([kind, item["metadata"]["name"], detail])
    print(_table(rows))


def volume_for(
    dyn: Any,
    namespace: str,
    claim: str,
    *,
    access_modes: tuple[str, ...] = ("ReadOnlyMany",),
    storage_class: str = "",
    capacity: str = "200Gi",
) -> None:
    """A hostPath PV reserved for claim `namespace/claim` (there is no provisioner here): the
    PV controller binds the claim to it once the claim exists."""
    dyn.resources.get(api_version="v1", kind="PersistentVolume").create(
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-{claim}"},
            "spec": {
                "capacity": {"storage": capacity},
                "accessModes": list(access_modes),
                "storageClassName": storage_class,
                "hostPath": {"path": "/models"},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        }
    )


def weights_volume(dyn: Any, namespace: str, claim: str = "dsv4-weights") -> None:
    """A pre-bound hostPath PV + PVC standing in for the model cache (no storage here)."""
    volume_for(dyn, namespace, claim)
    dyn.resources.get(api_version="v1", kind="PersistentVolumeClaim").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": f"{namespace}-{claim}",
                "resources": {"requests": {"storage": "200Gi"}},
            },
        },
    )


def main() -> int:
    doc = yaml.safe_load(EXAMPLE.read_text())
    name, namespace = doc["metadata"]["name"], doc["metadata"].get("namespace", "default")
    say("starting etcd, kube-apiserver, controller-manager, scheduler and kwok on 127.0.0.1")
    with ControlPlane(with_scheduler=True, with_kwok=True, crds=[CRD]) as cp:
        for node, gpus, product in GPU_NODES:
            cp.add_gpu_node(node, gpus=gpus, product=product)
        say(f"fake GPU nodes: {', '.join(n for n, _, _ in GPU_NODES)}")
        dyn = cp.dynamic_client()
        weights_volume(dyn, namespace, doc["spec"]["model"]["cache"]["pvc"]["claimName"])
        with operator_process(cp.kubeconfig_path):
            say("operator running (dsv4 run); applying examples/dsv4.yaml")
            started = time.monotonic()
            api = dyn.resources.get(api_version="dsv4.io/v1alpha1", kind="DSV4Deployment")
            api.server_side_apply(body=doc, namespace=namespace, field_manager="demo")

            def ready() -> bool:
                status = api.get(name=name, namespace=namespace).to_dict().get("status", {})
                return bool(status.get("phase") == "Ready")

            try:
                wait_until(
                    "the deployment to be Ready",
                    ready,
                    timeout=float(os.environ.get("DSV4_DEMO_TIMEOUT", "240")),
                )
            except TimeoutError:
                show(dyn, namespace, name)
                raise
            say(
                f"Ready after {time.monotonic() - started:.1f}s "
                "(kwok plays the kubelet; no engine really runs)"
            )
            show(dyn, namespace, name)
    say("control plane stopped, nothing left behind")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
