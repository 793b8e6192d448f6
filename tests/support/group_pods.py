"""Pods of a multi-node group (LeaderWorkerSet labels) as the API server returns them."""

from __future__ import annotations

from typing import Any


def group_pod(
    worker: int,
    revision: str,
    restarts: int = 0,
    message: str = "",
    reason: str = "OOMKilled",
    *,
    uid: str | None = None,
    terminated: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod of group 0 of x-decode in namespace ns (worker 0 is the leader), its container
    restarted `restarts` times (last terminated with `reason`, exit 137, `message`), or ended
    now (`terminated`: the container's state, as when the group is being deleted)."""
    name = "x-decode-0" if worker == 0 else f"x-decode-0-{worker}"
    container: dict[str, Any] = {"name": "engine", "restartCount": restarts, "state": {}}
    if restarts:
        container["lastState"] = {
            "terminated": {"reason": reason, "exitCode": 137, "message": message}
        }
    if terminated is not None:
        container["state"] = {"terminated": terminated}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{worker}",
            "labels": {
                "dsv4.io/deployment": "x",
                "dsv4.io/role": "decode",
                "dsv4.io/revision": revision,
                "leaderworkerset.sigs.k8s.io/name": "x-decode",
                "leaderworkerset.sigs.k8s.io/group-index": "0",
                "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
            },
        },
        "status": {"phase": "Running", "containerStatuses": [container]},
    }
