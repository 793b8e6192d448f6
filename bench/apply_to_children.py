"""Benchmark: seconds from `kubectl apply` of examples/dsv4.yaml to all children present.

Runs the real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) and
the operator (`dsv4 run`) once, then applies the example into N fresh namespaces one after
another and times, for each, apply -> every child object exists, and apply -> phase Ready
(kwok marks pods Ready at once, so "Ready" measures the operator and the control plane, not
an engine). Prints each run and the median and max.

    python bench/apply_to_children.py [--runs 10]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.deployments import POOL, POOL_LABEL, RTX, Cluster, example, weights_volume
from dsv4_devcluster.operator import OperatorProcess

REPO = Path(__file__).resolve().parents[1]

EXPECTED = 9  # 2 StatefulSets + 3 Services + 1 Deployment + 3 PodDisruptionBudgets


def _all_children(cluster: Cluster) -> bool:
    return len(cluster.children()) >= EXPECTED


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    crd = REPO / "crds" / "dsv4.io_dsv4deployments.yaml"
    to_children: list[float] = []
    to_ready: list[float] = []
    with (
        ControlPlane(with_scheduler=True, with_kwok=True, crds=[crd]) as cp,
        tempfile.TemporaryDirectory() as logs,
    ):
        for i in range(args.runs + 1):  # each run takes 8 GPUs (TP4 + TP4) and keeps them
            cp.add_gpu_node(f"bench-rtx-{i}", gpus=8, product=RTX, labels={POOL_LABEL: POOL})
        dyn = cp.dynamic_client()
        namespaces = dyn.resources.get(api_version="v1", kind="Namespace")
        operator = OperatorProcess(cp.kubeconfig_path, "", Path(logs)).start()
        try:
            for run in range(args.runs):
                ns = f"bench-{run}"
                namespaces.create(
                    body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                )
                weights_volume(dyn, ns)
                cluster = Cluster(dyn, ns)
                start = time.monotonic()
                cluster.apply(example(ns))
                wait_for(
                    f"{EXPECTED} children in {ns}",
                    functools.partial(_all_children, cluster),
                    timeout=300,
                    interval=0.05,
                )
                to_children.append(time.monotonic() - start)
                cluster.wait_phase("Ready", timeout=120)
                to_ready.append(time.monotonic() - start)
                print(
                    f"run {run + 1}: children {to_children[-1]:.2f}s, Ready {to_ready[-1]:.2f}s",
                    flush=True,
                )
        finally:
            operator.stop()
    print(
        f"apply -> all children present: median {statistics.median(to_children):.2f}s, "
        f"max {max(to_children):.2f}s over {args.runs} runs"
    )
    print(
        f"apply -> phase Ready (kwok pods): median {statistics.median(to_ready):.2f}s, "
        f"max {max(to_ready):.2f}s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
