"""The example DSV4Deployment on fake GPU nodes of a test pool, the weights volume it claims
(pre-bound hostPath volumes: there is no storage here), and typed-enough access to it and its
children: what the demo, the integration tests and the benchmarks apply and read.

    names = rtx_pool(cp, "bench", 2)               # two 8-GPU RTX PRO nodes in the test pool
    weights_volume(cp.dynamic_client(), "ns")      # the PVC `dsv4-weights`, bound
    cluster = Cluster(cp.dynamic_client(), "ns")
    cluster.apply(example("ns", **{"engine.maxRunningRequests": 48}))
    cluster.wait_phase("Ready")
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from dsv4_devcluster.process import wait_for
from dsv4_operator.names import (
    API_VERSION,
    DEPLOYMENT_LABEL,
    FORMAT_LABEL,
    KIND,
    LWS_API_VERSION,
    LWS_KIND,
    ROLE_LABEL,
    ROUTER,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "dsv4.yaml"
POOL_LABEL = "dsv4-test-pool"
POOL = "operator"
RTX = "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"


def rtx_pool(control_plane: Any, prefix: str, count: int, pool: str = POOL) -> list[str]:
    """`count` 8-GPU RTX PRO nodes named `<prefix>-<i>`, labelled into the test pool `pool`."""
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        control_plane.add_gpu_node(name, gpus=8, product=RTX, labels={POOL_LABEL: pool})
    return names


def example(namespace: str, name: str = "dsv4-flash", **changes: Any) -> dict[str, Any]:
    """The example DSV4Deployment in `namespace`, pinned to the test node pool."""
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": name, "namespace": namespace}
    for role in ("prefill", "decode"):
        doc["spec"][role]["nodeSelector"] = {POOL_LABEL: POOL}
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = doc["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return doc


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


def baked_revision(obj: Mapping[str, Any]) -> str | None:
    """The revision `obj` (a DSV4Deployment) serves, when it is baked: the status observed the
    object's generation, the rollout is done (phase Ready) and the last known good revision is
    the current one; else None.

    The generation and the phase matter: the pass that observes a new generation keeps
    `currentRevision` at the revision every role still runs until the rollout completes, so
    right after a change is applied over a baked revision, current and last known good agree
    while the new rollout has not begun."""
    status = obj.get("status") or {}
    good = status.get("lastKnownGoodRevision")
    baked = (
        bool(good)
        and good == status.get("currentRevision")
        and status.get("phase") == "Ready"
        and status.get("observedGeneration") == obj.get("metadata", {}).get("generation")
    )
    return str(good) if baked else None


class Cluster:
    """Thin, typed-enough access to what the tests read and write."""

    def __init__(self, dyn: Any, namespace: str) -> None:
        self.dyn, self.namespace = dyn, namespace
        self.dsv4 = dyn.resources.get(api_version=API_VERSION, kind=KIND)
        self.unserved: set[str] = set()  # kinds the API server does not serve

    def apply(self, doc: dict[str, Any]) -> None:
        self.dsv4.server_side_apply(
            body=doc, namespace=self.namespace, field_manager="tests", force_conflicts=True
        )

    def get(self, name: str = "dsv4-flash") -> dict[str, Any]:
        obj: dict[str, Any] = self.dsv4.get(name=name, namespace=self.namespace).to_dict()
        return obj

    def items(
        self, api_version: str, kind: str, selector: str | None = None
    ) -> list[dict[str, Any]]:
        res = self.dyn.resources.get(api_version=api_version, kind=kind)
        items: list[dict[str, Any]] = res.get(
            namespace=self.namespace, label_selector=selector
        ).to_dict()["items"]
        return items

    def children(self, name: str = "dsv4-flash") -> dict[tuple[str, str], dict[str, Any]]:
        selector = f"{DEPLOYMENT_LABEL}={name}"
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for api_version, kind in (
            ("apps/v1", "StatefulSet"),
            ("apps/v1", "Deployment"),
            ("v1", "Service"),
            ("policy/v1", "PodDisruptionBudget"),
            (LWS_API_VERSION, LWS_KIND),  # multi-node roles, where LWS is installed
        ):
            if kind in self.unserved:
                continue
            try:
                items = self.items(api_version, kind, selector)
            except ResourceNotFoundError:  # a plane without LWS: asked once, not every poll
                self.unserved.add(kind)
                continue
            for item in items:
                out[(kind, item["metadata"]["name"])] = item
        return out

    def revisions(self, name: str = "dsv4-flash") -> list[dict[str, Any]]:
        return [
            r
            for r in self.items("apps/v1", "ControllerRevision", f"{DEPLOYMENT_LABEL}={name}")
            if r["metadata"]["ownerReferences"][0]["kind"] == KIND
        ]

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return self.items("v1", "Pod", selector)

    def events(self, name: str = "dsv4-flash") -> list[dict[str, Any]]:
        return [
            e
            for e in self.items("v1", "Event")
            if e["involvedObject"].get("name") == name
            and e["involvedObject"].get("kind") == "DSV4Deployment"
        ]

    def wait_events(
        self, *reasons: str, name: str = "dsv4-flash", timeout: float = 30
    ) -> list[dict[str, Any]]:
        """The deployment's Events once every reason is among them.

        The operator posts Events beside the status patch (not before it), so a test that has
        just seen a condition waits for the matching Event rather than reading it at once.
        """

        def check() -> list[dict[str, Any]] | None:
            events = self.events(name)
            return events if set(reasons) <= {e["reason"] for e in events} else None

        return wait_for(f"events {sorted(reasons)} on {name}", check, timeout=timeout)

    def wait_phase(
        self,
        phase: str,
        name: str = "dsv4-flash",
        timeout: float = 180,
        revision: str | None = None,
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.get(name)
            status = obj.get("status", {})
            ok = (
                status.get("phase") == phase
                and status.get("observedGeneration") == obj["metadata"]["generation"]
            )
            if revision is not None:
                ok = ok and status.get("currentRevision") == revision
            return obj if ok else None

        return wait_for(f"{name} phase {phase}", check, timeout=timeout)

    def wait_baked(self, name: str = "dsv4-flash", timeout: float = 180) -> str:
        """The revision served, once `baked_revision` says it baked."""
        return wait_for(
            f"{name}'s served revision to bake", lambda: baked_revision(self.get(name)), timeout
        )

    def router_formats(self, name: str = "dsv4-flash") -> list[set[str]]:
        """For every router pod (terminating ones too), the transfer-format labels of the
        engine pods its arguments target. A set with two formats means that router could feed
        old prefill into new decode (or the reverse): the tests assert it never happens.
        """
        pods = self.pods(f"{DEPLOYMENT_LABEL}={name}")
        by_name = {p["metadata"]["name"]: p for p in pods}
        out = []
        for router in (p for p in pods if p["metadata"]["labels"].get(ROLE_LABEL) == ROUTER):
            command = router["spec"]["containers"][0]["command"]
            targets = [
                command[i + 1].split("//", 1)[1].split(".", 1)[0]
                for i, token in enumerate(command)
                if token in ("--prefill", "--decode")
            ]
            out.append(
                {by_name[t]["metadata"]["labels"][FORMAT_LABEL] for t in targets if t in by_name}
            )
        return out
