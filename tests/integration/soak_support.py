"""Soak helpers: a pod watcher that checks the transfer-format invariant at every event, and
the exact set of children a settled deployment owns."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dsv4_devcluster.deployments import Cluster
from dsv4_operator.names import (
    DEPLOYMENT_LABEL,
    FORMAT_LABEL,
    PAIR_LABEL,
    REVISION_LABEL,
    ROLE_LABEL,
    ROUTER,
    TARGET_PAIR_ANNOTATION,
)


def router_targets(pod: dict[str, Any]) -> list[str]:
    """The engine pod names a router pod's arguments send requests to."""
    command = pod["spec"]["containers"][0]["command"]
    return [
        command[i + 1].split("//", 1)[1].split(".", 1)[0]
        for i, token in enumerate(command)
        if token in ("--prefill", "--decode")
    ]


def mixed_routers(pods: dict[str, dict[str, Any]]) -> list[str]:
    """Router pods (terminating ones too) whose targets carry more than one transfer format:
    a router that could feed one format's prefill into another format's decode."""
    out = []
    for name, pod in pods.items():
        if pod["metadata"].get("labels", {}).get(ROLE_LABEL) != ROUTER:
            continue
        formats = {
            pods[t]["metadata"]["labels"].get(FORMAT_LABEL)
            for t in router_targets(pod)
            if t in pods
        }
        if len(formats) > 1:
            out.append(f"{name} -> {sorted(str(f) for f in formats)}")
    return out


@dataclass
class FormatWatcher:
    """Watches every pod of a namespace and checks :func:`mixed_routers` after each event.

    A watch on one resource delivers its events in resourceVersion order, so the map after
    each event is a state the cluster really passed through: nothing between two polls is
    missed. A broken stream (the API server restarted) is re-listed and watched again.
    """

    core: Any  # kubernetes.client.CoreV1Api
    namespace: str
    events: int = 0
    relists: int = 0
    violations: list[str] = field(default_factory=list)
    _pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> FormatWatcher:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _check(self, where: str) -> None:
        for bad in mixed_routers(self._pods):
            self.violations.append(f"{where}: {bad}")

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            try:
                listed = self.core.list_namespaced_pod(self.namespace, _request_timeout=10)
                api = self.core.api_client
                self._pods = {
                    p.metadata.name: api.sanitize_for_serialization(p) for p in listed.items
                }
                self.relists += 1
                self._check(f"list at {listed.metadata.resource_version}")
                version = listed.metadata.resource_version
                while not self._stop.is_set():
                    stream = watch.Watch().stream(
                        self.core.list_namespaced_pod,
                        self.namespace,
                        resource_version=version,
                        timeout_seconds=5,
                        _request_timeout=15,
                    )
                    for event in stream:
                        pod = api.sanitize_for_serialization(event["object"])
                        name, version = pod["metadata"]["name"], pod["metadata"]["resourceVersion"]
                        if event["type"] == "DELETED":
                            self._pods.pop(name, None)
                        else:
                            self._pods[name] = pod
                        self.events += 1
                        self._check(f"{event['type']} {name} at {version}")
            except Exception:  # the API server is away or the version expired: list again
                time.sleep(0.5)


def settled_children(cluster: Cluster, name: str, revision: str) -> list[str]:
    """What keeps `name` from being settled on `revision` (empty when it is): exactly one
    prefill and one decode StatefulSet of that revision with their Service and PDB, one router
    targeting that pair, every pod of the deployment belonging to them and Ready, and nothing
    else carrying the deployment's label (no orphan, no duplicate)."""
    problems: list[str] = []
    children = cluster.children(name)
    sets = {n: o for (k, n), o in children.items() if k == "StatefulSet"}
    roles = sorted(o["metadata"]["labels"].get(ROLE_LABEL, "?") for o in sets.values())
    if roles != ["decode", "prefill"]:
        problems.append(f"StatefulSets {sorted(sets)}")
    for sts_name, sts in sets.items():
        label = sts["spec"]["template"]["metadata"]["labels"].get(REVISION_LABEL)
        if label != revision:
            problems.append(f"{sts_name} on revision {label}")
    routers = [n for (k, n), _ in children.items() if k == "Deployment"]
    engines = set(sets)
    expected = {
        *(("StatefulSet", n) for n in engines),
        *(("Service", n) for n in engines),
        *(("PodDisruptionBudget", n) for n in engines),
        ("Deployment", f"{name}-router"),
        ("Service", f"{name}-router"),
        ("PodDisruptionBudget", f"{name}-router"),
    }
    if set(children) != expected:
        problems.append(
            f"children differ: extra {sorted(set(children) - expected)}, "
            f"missing {sorted(expected - set(children))}"
        )
    pairs = {o["spec"]["template"]["metadata"]["labels"].get(PAIR_LABEL) for o in sets.values()}
    for router in routers:
        annotations = children[("Deployment", router)]["metadata"].get("annotations", {})
        if {annotations.get(TARGET_PAIR_ANNOTATION)} != pairs:
            problems.append(f"{router} targets {annotations.get(TARGET_PAIR_ANNOTATION)}")
    wanted = {n: sts["spec"]["replicas"] for n, sts in sets.items()}
    for pod in cluster.pods(f"{DEPLOYMENT_LABEL}={name}"):
        meta = pod["metadata"]
        owner = (meta.get("ownerReferences") or [{}])[0]
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        if meta.get("deletionTimestamp") or not ready:
            problems.append(f"pod {meta['name']} not settled")
        elif owner.get("kind") == "StatefulSet":
            if owner.get("name") not in wanted:
                problems.append(f"pod {meta['name']} of {owner.get('name')}")
            elif meta["labels"].get(REVISION_LABEL) != revision:
                problems.append(f"pod {meta['name']} on {meta['labels'].get(REVISION_LABEL)}")
            else:
                wanted[owner["name"]] -= 1
        elif stray := [t for t in router_targets(pod) if t.rsplit("-", 1)[0] not in engines]:
            problems.append(f"router pod {meta['name']} targets {stray}")
    problems += [f"{n} lacks {k} ready pods" for n, k in wanted.items() if k]
    hashes = [r["metadata"]["labels"].get(REVISION_LABEL) for r in cluster.revisions(name)]
    if len(hashes) != len(set(hashes)):
        problems.append(f"duplicate ControllerRevisions {sorted(hashes)}")
    return problems
