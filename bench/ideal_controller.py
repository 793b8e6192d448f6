"""A controller that does only what any controller of DSV4Deployments must: bench/scale.py's
floor for "children: operator vs plain apply".

Not the product and not a double of it: it watches DSV4Deployments in one namespace and, for
each one added, server-side applies the children `dsv4 render` gave for it (with the owner
reference a controller sets) CHILD_APPLIES_AT_ONCE at a time, `workers` deployments at once,
then writes its status once. Nothing else: no revision stored, no Event, no watch of the
children or pods, no guard. Beside the plain apply's requests that leaves what no controller
can drop: the user's create of the DSV4Deployment, the API server's watch of it, one status
write, and the controller's own CPU on this machine's shared cores.

    python bench/ideal_controller.py KUBECONFIG NAMESPACE CHILDREN_JSON [--workers 4]

CHILDREN_JSON maps each deployment's name to its rendered children. Runs until terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from dsv4_operator.kube.client import KubeClient, http_client_for, load_configuration
from dsv4_operator.kube.errors import KubeError
from dsv4_operator.kube.resources import DSV4
from dsv4_operator.reconcile.act import CHILD_APPLIES_AT_ONCE


async def reconcile(
    client: KubeClient, obj: dict[str, Any], children: list[dict[str, Any]]
) -> None:
    meta = obj["metadata"]
    owner = {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    gate = asyncio.Semaphore(CHILD_APPLIES_AT_ONCE)

    async def one(child: dict[str, Any]) -> None:
        async with gate:
            await client.apply(
                {**child, "metadata": {**child["metadata"], "ownerReferences": [owner]}}
            )

    await asyncio.gather(*(one(c) for c in children))
    status = {"observedGeneration": meta["generation"], "phase": "Progressing"}
    await client.apply_status(DSV4, meta["namespace"], meta["name"], status)


async def run(
    kubeconfig: str, namespace: str, children: dict[str, list[dict[str, Any]]], workers: int
) -> None:
    client = KubeClient(
        http_client_for(load_configuration(kubeconfig), timeout=120), field_manager="ideal"
    )
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def worker() -> None:
        while True:
            obj = await queue.get()
            try:
                await reconcile(client, obj, children[obj["metadata"]["name"]])
            except KubeError as error:  # said in its log; the deployment is tried again
                print(f"{obj['metadata']['name']}: {error}; again", file=sys.stderr, flush=True)
                queue.put_nowait(obj)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    path = DSV4.path(namespace)
    listed = (await client.http.get(path)).json()
    for item in listed["items"]:
        queue.put_nowait({**item, "apiVersion": DSV4.api_version, "kind": DSV4.kind})
    version = listed["metadata"]["resourceVersion"]
    params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "false"}
    async with client.http.stream("GET", path, params=params, timeout=None) as response:
        async for line in response.aiter_lines():
            event = json.loads(line)
            if event["type"] == "ADDED":
                queue.put_nowait(event["object"])
    for task in tasks:
        task.cancel()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kubeconfig")
    parser.add_argument("namespace")
    parser.add_argument("children", type=Path)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    children = json.loads(args.children.read_text())
    asyncio.run(run(args.kubeconfig, args.namespace, children, args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
