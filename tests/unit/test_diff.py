"""diff.in_place: what others add to a child is not drift; what the operator set must stay."""

from __future__ import annotations

import copy
from typing import Any

from dsv4_operator.reconcile.diff import in_place, stamped


def _desired() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "x-decode", "namespace": "ns"},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "args": ["--tp", "4"],
                            "env": [{"name": "A", "value": "1"}],
                            "ports": [{"containerPort": 30000, "name": "http"}],
                        }
                    ],
                    "volumes": [{"name": "weights", "emptyDir": {}}],
                }
            }
        },
    }


def _live(desired: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(stamped(desired))


def test_a_sidecar_and_env_injected_by_others_are_not_drift() -> None:
    want = stamped(_desired())
    live = _live(_desired())
    pod = live["spec"]["template"]["spec"]
    pod["containers"].insert(0, {"name": "istio-proxy", "image": "proxy"})
    pod["containers"][1]["env"].append({"name": "MESH", "value": "on"})
    pod["volumes"].append({"name": "istio-certs", "emptyDir": {}})
    assert in_place(want, live)


def test_a_changed_or_removed_own_item_is_drift() -> None:
    want = stamped(_desired())
    changed = _live(_desired())
    changed["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "2"
    assert not in_place(want, changed)
    removed = _live(_desired())
    removed["spec"]["template"]["spec"]["containers"][0]["env"] = []
    assert not in_place(want, removed)
    # Atomic lists stay exact: an extra argument is drift.
    args = _live(_desired())
    args["spec"]["template"]["spec"]["containers"][0]["args"].append("--x")
    assert not in_place(want, args)


def test_mounts_merge_by_mount_path_and_duplicate_keys_compare_exactly() -> None:
    desired = _desired()
    engine = desired["spec"]["template"]["spec"]["containers"][0]
    # The same volume mounted twice: `name` repeats, mountPath does not.
    engine["volumeMounts"] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "tmp", "mountPath": "/var/tmp", "subPath": "var"},
    ]
    want = stamped(desired)
    live = _live(desired)
    mounts = live["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    mounts.append({"name": "istio-certs", "mountPath": "/etc/istio"})
    assert in_place(want, live)
    mounts[1]["subPath"] = "other"
    assert not in_place(want, live)
