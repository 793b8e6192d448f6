"""The playground's storage: a default StorageClass and a provisioner that makes a hostPath
PersistentVolume under the playground's directory for each claim of that class.

It does what an external provisioner (local-path-provisioner, say) does: it watches for
claims of its class that the PV controller marked for it (``volume.kubernetes.io/storage-
provisioner``) and creates a volume bound to the claim (``claimRef``), of the claim's size and
access modes; the PV controller binds them. A released volume of its class is deleted with its
directory (reclaim policy Delete), as a dynamic provisioner does.
"""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path
from typing import Any

STORAGE_CLASS = "playground-local"
PROVISIONER = "playground.dsv4.io/hostpath"
_PROVISIONER_ANNOTATION = "volume.kubernetes.io/storage-provisioner"
_DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def storage_class() -> dict[str, Any]:
    """The default StorageClass: claims that name no class get this one."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {_DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def volume_for_claim(claim: dict[str, Any], root: Path) -> dict[str, Any]:
    """The hostPath PersistentVolume a claim of the class gets (its directory made)."""
    meta = claim["metadata"]
    name = f"pvc-{meta['uid']}"
    path = root / f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}"
    path.mkdir(parents=True, exist_ok=True)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
        "spec": {
            "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
            "accessModes": list(claim["spec"].get("accessModes") or ["ReadWriteOnce"]),
            "storageClassName": STORAGE_CLASS,
            "persistentVolumeReclaimPolicy": "Delete",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
            },
        },
    }


def wants_volume(claim: dict[str, Any]) -> bool:
    """A pending claim of this class, handed to this provisioner, with no volume yet."""
    spec, meta = claim["spec"], claim["metadata"]
    annotations = meta.get("annotations") or {}
    return (
        spec.get("storageClassName") == STORAGE_CLASS
        and not spec.get("volumeName")
        and (claim.get("status") or {}).get("phase") == "Pending"
        and annotations.get(_PROVISIONER_ANNOTATION, PROVISIONER) == PROVISIONER
        and not meta.get("deletionTimestamp")
    )


class LocalProvisioner:
    """Polls claims and volumes every ``interval`` seconds on a thread of its own."""

    def __init__(self, dyn: Any, root: Path, interval: float = 0.5) -> None:
        self.dyn, self.root, self.interval = dyn, root, interval
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="provisioner", daemon=True)

    def start(self) -> LocalProvisioner:
        classes = self.dyn.resources.get(api_version="storage.k8s.io/v1", kind="StorageClass")
        classes.create(body=storage_class())
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception as error:  # the API server restarting, say: the next round retries
                message = f"{type(error).__name__}: {error}"
                if not self.errors or self.errors[-1] != message:  # once, not every round
                    self.errors.append(message)

    def sync(self) -> None:
        claims = self.dyn.resources.get(api_version="v1", kind="PersistentVolumeClaim")
        volumes = self.dyn.resources.get(api_version="v1", kind="PersistentVolume")
        existing = {v["metadata"]["name"]: v for v in volumes.get().to_dict()["items"]}
        for claim in claims.get().to_dict()["items"]:
            if wants_volume(claim) and f"pvc-{claim['metadata']['uid']}" not in existing:
                volumes.create(body=volume_for_claim(claim, self.root))
        for name, volume in existing.items():
            released = (volume.get("status") or {}).get("phase") == "Released"
            ours = volume["spec"].get("storageClassName") == STORAGE_CLASS
            if (
                released
                and ours
                and volume["spec"].get("persistentVolumeReclaimPolicy") == "Delete"
            ):
                volumes.delete(name=name)
                path = Path(volume["spec"]["hostPath"]["path"])
                if path.is_relative_to(self.root) and re.fullmatch(r"[\w.-]+", path.name):
                    shutil.rmtree(path, ignore_errors=True)
