"""diff.to_apply: what others add to a child is not drift; what the operator set must stay."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dsv4_operator.names import APPLIED_ANNOTATION
from dsv4_operator.reconcile import diff
from dsv4_operator.reconcile.diff import to_apply


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


def stamped(desired: dict[str, Any]) -> dict[str, Any]:
    applied = to_apply(desired, None)
    assert applied is not None
    return applied


def _live(desired: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    """As the API server holds `desired` once applied (with a uid and `version` if given)."""
    live = copy.deepcopy(stamped(desired))
    if version is not None:
        live["metadata"].update(uid="uid-1", resourceVersion=version)
    return live


def in_place(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    return to_apply(desired, live) is None


def test_a_sidecar_and_env_injected_by_others_are_not_drift() -> None:
    want = _desired()
    live = _live(_desired())
    pod = live["spec"]["template"]["spec"]
    pod["containers"].insert(0, {"name": "istio-proxy", "image": "proxy"})
    pod["containers"][1]["env"].append({"name": "MESH", "value": "on"})
    pod["volumes"].append({"name": "istio-certs", "emptyDir": {}})
    assert in_place(want, live)


def test_a_changed_or_removed_own_item_is_drift() -> None:
    want = _desired()
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
    want = desired
    live = _live(desired)
    mounts = live["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    mounts.append({"name": "istio-certs", "mountPath": "/etc/istio"})
    assert in_place(want, live)
    mounts[1]["subPath"] = "other"
    assert not in_place(want, live)


def test_the_applied_copy_carries_the_hash_and_leaves_the_desired_object_alone() -> None:
    desired = _desired()
    applied = stamped(desired)
    digest = applied["metadata"]["annotations"][APPLIED_ANNOTATION]
    assert len(digest) == diff.APPLIED_HASH_LENGTH
    assert "annotations" not in desired["metadata"]
    assert applied["metadata"].pop("annotations") == {APPLIED_ANNOTATION: digest}
    assert applied == desired
    changed = _desired()
    changed["spec"]["template"]["spec"]["containers"][0]["args"] = ["--tp", "8"]
    assert stamped(changed)["metadata"]["annotations"][APPLIED_ANNOTATION] != digest


def test_a_version_found_in_place_is_remembered_and_a_new_version_is_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checks: list[object] = []
    real = diff._subset

    def counted(want: Any, have: Any) -> bool:
        if isinstance(want, dict) and "apiVersion" in want:  # a whole object, not a field
            checks.append(want)
        return real(want, have)

    monkeypatch.setattr(diff, "_subset", counted)
    monkeypatch.setattr(diff, "_IN_PLACE", diff._InPlaceMemo(2))
    live = _live(_desired(), version="7")
    assert in_place(_desired(), live) and len(checks) == 1
    assert in_place(_desired(), live) and len(checks) == 1  # remembered: not walked again
    # Another writer changed a field the operator owns: a new version, walked, drift found.
    drifted = _live(_desired(), version="8")
    drifted["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "2"
    assert not in_place(_desired(), drifted) and len(checks) == 2
    # Other content for the same version is another entry; without a version, no memo.
    other = _desired()
    other["spec"]["template"]["spec"]["volumes"] = []
    assert not in_place(other, live)
    unversioned = _live(_desired())
    assert in_place(_desired(), unversioned) and in_place(_desired(), unversioned)
    assert len(checks) == 4
    # At most `size` versions kept, the oldest dropped first.
    for version in ("9", "10"):
        assert in_place(_desired(), _live(_desired(), version=version))
    assert in_place(_desired(), live) and len(checks) == 7
