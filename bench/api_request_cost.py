"""Benchmark: the API server's CPU per request of each kind a create of a DSV4Deployment makes.

On a fresh control plane (API server, etcd and controller-manager; no scheduler, no kwok, no
operator), `--n` requests of one kind at a time, 4 in flight, each batch timed by the API
server's own CPU (/proc: utime + stime) and divided by `--n`:

- the DSV4Deployment create (the user's) and its status write, by server-side apply (the
  operator's) and by merge patch;
- a headless Service and a StatefulSet (0 replicas) by server-side apply: the children;
- a ControllerRevision create and an Event create (what a pass writes after it).

Which of a create's requests cost the API server most, without the rest of a cluster: the
per-request figures behind bench/scale.py's creation windows. `--crd FILE` measures another
CRD (for example one without its CEL rules). Last, it counts what the requests made, read back
from the API server (a batch that made nothing would be priced at nothing).

    python bench/api_request_cost.py [--n 200] [--crd crds/dsv4.io_dsv4deployments.yaml]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import time
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any

from dsv4_devcluster import ControlPlane
from dsv4_devcluster.deployments import example
from dsv4_devcluster.process import cpu_seconds
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.client import KubeClient, http_client_for, load_configuration
from dsv4_operator.kube.resources import CONTROLLER_REVISION, DSV4, EVENT, SERVICE, STATEFULSET
from dsv4_operator.render.children import render_spec

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "cost"
IN_FLIGHT = 4
STATUS = {
    "observedGeneration": 1,
    "phase": "Progressing",
    "conditions": [
        {
            "type": "Progressing",
            "status": "True",
            "reason": "Creating",
            "message": "creating revision abc",
            "lastTransitionTime": "2026-12-05T00:00:00Z",
        }
    ],
}


async def cost(pid: int, calls: Iterable[Awaitable[Any]], n: int) -> float:
    """Milliseconds of API server CPU per request, `IN_FLIGHT` requests at a time."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def one(call: Awaitable[Any]) -> None:
        async with gate:
            await call

    before = cpu_seconds(pid)
    await asyncio.gather(*(one(c) for c in calls))
    await asyncio.sleep(1.0)  # what the requests left to do (watch fan-out) is theirs too
    return 1000 * (cpu_seconds(pid) - before) / n


def children(kind: str, n: int) -> list[dict[str, Any]]:
    """`n` copies of the example's rendered `kind` (what `dsv4 render` prints), renamed, made
    cheap to hold: Services headless, StatefulSets at 0 replicas."""
    doc = example(NAMESPACE)
    spec = DSV4DeploymentSpec.model_validate(doc["spec"])
    rendered = render_spec(doc["metadata"]["name"], NAMESPACE, spec)
    template = next(d for d in rendered if d["kind"] == kind)
    out = []
    for i in range(n):
        obj = copy.deepcopy(template)
        obj["metadata"]["name"] = f"{kind.lower()}-{i}"
        if kind == "Service":
            obj["spec"]["clusterIP"] = "None"
        if kind == "StatefulSet":
            obj["spec"]["replicas"] = 0
        out.append(obj)
    return out


async def made(client: KubeClient) -> str:
    """What the batches left in the namespace, read back: each kind's objects by the names the
    bench gave them (the controllers add ControllerRevisions and Events of their own)."""
    prefixes = {DSV4: "d-", SERVICE: "service-", STATEFULSET: "statefulset-"}
    prefixes |= {CONTROLLER_REVISION: "r-", EVENT: "e-"}
    counts = []
    for kind, prefix in prefixes.items():
        objects = [
            o
            for o in await client.list(kind, NAMESPACE)
            if o["metadata"]["name"].startswith(prefix)
        ]
        counts.append(f"{kind.kind} {len(objects)}")
        if kind is DSV4:  # the merge patch came last
            ready = sum((o.get("status") or {}).get("phase") == "Ready" for o in objects)
            counts[-1] += f" (status Ready {ready})"
    return ", ".join(counts)


async def measure(crd: Path, n: int) -> tuple[list[tuple[str, float]], str]:
    with ControlPlane(crds=[crd]) as cp:
        pid = cp.component("kube-apiserver").pid
        cp.dynamic_client().resources.get(api_version="v1", kind="Namespace").create(
            body={"metadata": {"name": NAMESPACE}}
        )
        client = KubeClient(
            http_client_for(load_configuration(str(cp.kubeconfig_path)), timeout=120),
            field_manager="cost",
        )
        try:
            docs = [example(NAMESPACE, name=f"d-{i:04d}") for i in range(n)]
            names = [d["metadata"]["name"] for d in docs]
            status_path = [DSV4.path(NAMESPACE, name) + "/status" for name in names]
            merged = {"status": {**STATUS, "phase": "Ready"}}
            revision = {"spec": docs[0]["spec"]}
            event = {
                "involvedObject": {"kind": DSV4.kind, "name": names[0], "namespace": NAMESPACE},
                "reason": "Creating",
                "message": "creating revision abc",
                "type": "Normal",
                "source": {"component": "cost"},
            }
            batches: list[tuple[str, Iterable[Awaitable[Any]]]] = [
                ("DSV4Deployment create", (client.create(d) for d in docs)),
                (
                    "DSV4Deployment status, server-side apply",
                    (client.apply_status(DSV4, NAMESPACE, name, STATUS) for name in names),
                ),
                (
                    "DSV4Deployment status, merge patch",
                    (
                        client.http.patch(
                            path,
                            json=merged,
                            headers={"Content-Type": "application/merge-patch+json"},
                        )
                        for path in status_path
                    ),
                ),
                (
                    "Service (headless), server-side apply",
                    map(client.apply, children("Service", n)),
                ),
                (
                    "StatefulSet (0 replicas), server-side apply",
                    map(client.apply, children("StatefulSet", n)),
                ),
                (
                    "ControllerRevision create",
                    (
                        client.create(
                            {
                                "apiVersion": "apps/v1",
                                "kind": "ControllerRevision",
                                "metadata": {"name": f"r-{i}", "namespace": NAMESPACE},
                                "data": revision,
                                "revision": 1,
                            }
                        )
                        for i in range(n)
                    ),
                ),
                (
                    "Event create",
                    (
                        client.create(
                            {
                                "apiVersion": "v1",
                                "kind": "Event",
                                "metadata": {"name": f"e-{i}", "namespace": NAMESPACE},
                                **event,
                            }
                        )
                        for i in range(n)
                    ),
                ),
            ]
            await asyncio.sleep(3)  # the control plane's own start-up work done
            rows = [(label, await cost(pid, calls, n)) for label, calls in batches]
            return rows, await made(client)
        finally:
            await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200, help="requests of each kind")
    parser.add_argument("--crd", type=Path, default=REPO / "crds" / "dsv4.io_dsv4deployments.yaml")
    args = parser.parse_args()
    started = time.monotonic()
    rows, objects = asyncio.run(measure(args.crd, args.n))
    print(f"API server CPU per request ({args.n} of each, {IN_FLIGHT} in flight; CRD {args.crd})")
    print("\n| request | ms of API server CPU |\n|---|---|")
    for label, ms in rows:
        print(f"| {label} | {ms:.2f} |")
    print(f"\nmade: {objects}")
    print(f"\nmeasured in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
