"""`dsv4-demo` (`make demo`): the main job on one machine, end to end, on a real control plane.

Starts etcd + kube-apiserver + controller-manager + scheduler + kwok (fake GPU nodes), installs
the CRD, runs the operator (`dsv4 run`) as a child process, applies
examples/dsv4-sglang-0.5.23.yaml (upstream SGLang 0.5.23, a public image), waits until the
engines are scheduled on GPU nodes of the right product and ready, prints the DSV4Deployment
and its children, and shuts everything down.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dsv4_devcluster import ControlPlane
from dsv4_devcluster.deployments import weights_volume
from dsv4_devcluster.operator import OperatorProcess

REPO = Path(__file__).resolve().parents[1]
CRD = REPO / "crds" / "dsv4.io_dsv4deployments.yaml"
EXAMPLE = REPO / "examples" / "dsv4-sglang-0.5.23.yaml"  # public parts: upstream 0.5.23
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


def main() -> int:
    # No options: `--help` says what the demo does instead of starting it.
    argparse.ArgumentParser(
        prog="dsv4-demo",
        description=__doc__,
        epilog="DSV4_DEMO_VERBOSE=1 shows the operator's log; DSV4_DEMO_TIMEOUT (seconds, "
        "default 240) bounds the wait for Ready.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args()
    doc = yaml.safe_load(EXAMPLE.read_text())
    name, namespace = doc["metadata"]["name"], doc["metadata"].get("namespace", "default")
    say("starting etcd, kube-apiserver, controller-manager, scheduler and kwok on 127.0.0.1")
    with ControlPlane(with_scheduler=True, with_kwok=True, crds=[CRD]) as cp:
        for node, gpus, product in GPU_NODES:
            cp.add_gpu_node(node, gpus=gpus, product=product)
        say(f"fake GPU nodes: {', '.join(n for n, _, _ in GPU_NODES)}")
        dyn = cp.dynamic_client()
        weights_volume(dyn, namespace, doc["spec"]["model"]["cache"]["pvc"]["claimName"])
        # The operator's output: to the terminal with DSV4_DEMO_VERBOSE, else to a file that
        # goes with the run (its tail is printed when the deployment does not get Ready).
        verbose = bool(os.environ.get("DSV4_DEMO_VERBOSE"))
        with (
            tempfile.TemporaryDirectory(prefix="dsv4-demo-") as logs,
            OperatorProcess(
                cp.kubeconfig_path, "", None if verbose else Path(logs), DSV4_RESYNC_SECONDS="5"
            ) as operator,
        ):
            say(f"operator running (dsv4 run); applying examples/{EXAMPLE.name}")
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
                print(f"\noperator log (tail):\n{operator.log_tail()}")
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
