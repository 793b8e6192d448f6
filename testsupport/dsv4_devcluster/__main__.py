"""``python -m dsv4_devcluster``: run a local control plane until Ctrl-C, for demos.

Prints the kubeconfig path and an ``export KUBECONFIG=...`` line, then waits. With the
default options it also starts kube-scheduler and kwok and registers fake GPU nodes, so
``kubectl`` (if you have one) or the Python client can schedule GPU pods against it;
``--lws`` adds the LeaderWorkerSet controller (multi-node roles).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from dsv4_devcluster.controlplane import ControlPlane

DEFAULT_NODES = (
    "gpu-rtxpro-0:8:NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
    "gpu-rtxpro-1:8:NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
    "gpu-h100-0:8:NVIDIA-H100-80GB-HBM3",
)


def _parse_node(spec: str) -> tuple[str, int, str]:
    try:
        name, gpus, product = spec.split(":", 2)
        return name, int(gpus), product
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected NAME:GPUS:PRODUCT, got {spec!r}") from exc


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m dsv4_devcluster",
        description="Run etcd + kube-apiserver + kube-controller-manager (+ kube-scheduler,"
        " kwok fake GPU nodes) on 127.0.0.1 until interrupted.",
    )
    parser.add_argument(
        "--minimal",
        action="store_true",
        help="only etcd, kube-apiserver and kube-controller-manager (no scheduler, no kwok)",
    )
    parser.add_argument(
        "--gpu-node",
        action="append",
        type=_parse_node,
        metavar="NAME:GPUS:PRODUCT",
        help="fake GPU node to register (repeatable; default: two RTX PRO 6000 nodes and one"
        " H100 node with 8 GPUs each)",
    )
    parser.add_argument(
        "--lws",
        action="store_true",
        help="also run the LeaderWorkerSet controller (sigs.k8s.io/lws) with its CRDs and"
        " webhooks, for multi-node roles",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the data dir (logs) after shutdown"
    )
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    full = not args.minimal
    nodes = args.gpu_node or ([_parse_node(s) for s in DEFAULT_NODES] if full else [])
    print("starting control plane (first run builds the binaries: minutes)...", flush=True)
    with ControlPlane(
        with_scheduler=full, with_kwok=full, with_lws=args.lws, keep_data_dir=args.keep
    ) as cp:
        for name, gpus, product in nodes:
            cp.add_gpu_node(name, gpus, product)
            print(f"node {name}: {gpus} x nvidia.com/gpu ({product})", flush=True)
        print(f"ready in {cp.startup_seconds:.1f}s: {cp.server_url}")
        print(f"kubeconfig: {cp.kubeconfig_path}")
        print(f"export KUBECONFIG={cp.kubeconfig_path}")
        print(f"logs: {cp.data_dir / 'logs'}")
        print("Ctrl-C to stop", flush=True)
        while not stop.wait(1.0):
            dead = [p.name for p in cp.processes if not p.alive()]
            if dead:
                print(f"component(s) exited: {', '.join(dead)}", file=sys.stderr)
                return 1
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
