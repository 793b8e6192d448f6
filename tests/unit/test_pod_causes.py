"""Why a pod is not ready, read from its status the way a kubelet and the scheduler write it
(each pod described as the API server returns it, read through its view)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dsv4_operator.pods import PodView
from dsv4_operator.reconcile.pod_causes import (
    EVENTS_REFRESH_SECONDS,
    MESSAGE_LIMIT,
    PodWarnings,
    first_fault,
    first_problem,
    pod_problem,
    seconds_until_causes_due,
    seconds_until_events_due,
    seconds_until_stuck,
    unexplained,
)
from tests.support.builders import silent_pod


def _pod(name: str, conditions: list[dict[str, Any]], containers: list[dict[str, Any]]) -> Any:
    return {
        "metadata": {"name": name},
        "status": {"conditions": conditions, "containerStatuses": containers},
    }


NOT_READY = {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (
            _pod(
                "x-decode-0",
                [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": '0/3 nodes are available: persistentvolumeclaim "dsv4-weights"'
                        " not found. preemption: 0/3 nodes are available.",
                    }
                ],
                [],
            ),
            "pod x-decode-0: Unschedulable: 0/3 nodes are available: persistentvolumeclaim "
            '"dsv4-weights" not found. preemption: 0/3 nodes are available.',
        ),
        (
            _pod(
                "x-prefill-0",
                [NOT_READY],
                [
                    {
                        "name": "engine",
                        "state": {
                            "waiting": {
                                "reason": "ImagePullBackOff",
                                "message": 'Back-off pulling image "registry.example.com/e:1"',
                            }
                        },
                    }
                ],
            ),
            "pod x-prefill-0 container engine: ImagePullBackOff: Back-off pulling image "
            '"registry.example.com/e:1"',
        ),
        (
            _pod(
                "x-decode-1",
                [NOT_READY],
                [
                    {
                        "name": "engine",
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                        "lastState": {
                            "terminated": {
                                "reason": "Error",
                                "exitCode": 1,
                                "message": "torch.OutOfMemoryError: CUDA out of memory.",
                            }
                        },
                    }
                ],
            ),
            "pod x-decode-1 container engine: CrashLoopBackOff, last Error: exit code 1, "
            "torch.OutOfMemoryError: CUDA out of memory.",
        ),
        (
            _pod(
                "x-decode-2",
                [NOT_READY],
                [
                    {
                        "name": "engine",
                        "state": {"running": {}},
                        "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                    }
                ],
            ),
            "pod x-decode-2 container engine: restarted after OOMKilled: exit code 137",
        ),
        (
            _pod(
                "x-router-1",
                [NOT_READY],
                [
                    {
                        "name": "router",
                        "state": {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": 'secret "hf-token" not found',
                            }
                        },
                    }
                ],
            ),
            'pod x-router-1 container router: CreateContainerConfigError: secret "hf-token" not '
            "found",
        ),
    ],
)
def test_the_cause_names_the_pod_and_what_kubernetes_says(pod: Any, expected: str) -> None:
    assert pod_problem(PodView.of(pod)) == expected


@pytest.mark.parametrize(
    "pod",
    [
        _pod(
            "starting",
            [NOT_READY],
            [{"name": "e", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        ),
        _pod("running", [NOT_READY], [{"name": "e", "state": {"running": {}}}]),
        _pod(
            "ready",
            [{"type": "Ready", "status": "True"}],
            [{"name": "e", "state": {"running": {}}}],
        ),
        {"metadata": {"name": "new"}},
    ],
)
def test_a_pod_on_its_way_has_no_problem(pod: Any) -> None:
    assert pod_problem(PodView.of(pod)) is None


def test_the_first_problem_is_stable_and_long_messages_are_cut() -> None:
    long = "x" * 2000
    pods = [
        _pod(
            "b",
            [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "b",
                }
            ],
            [],
        ),
        _pod(
            "a",
            [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": long,
                }
            ],
            [],
        ),
    ]
    problem = first_problem([PodView.of(p) for p in pods])
    assert problem is not None and problem.startswith("pod a: Unschedulable: xxx")
    assert len(problem) < MESSAGE_LIMIT + 40
    assert first_problem([PodView.of(p) for p in reversed(pods)]) == problem


def test_a_pod_whose_status_says_nothing_is_explained_by_its_newest_warning() -> None:
    pod = silent_pod("2026-11-29T11:59:00Z")
    events = [
        {
            "type": "Warning",
            "reason": "FailedMount",
            "message": "old",
            "lastTimestamp": "2026-11-29T11:59:10Z",
        },
        {
            "type": "Normal",
            "reason": "Scheduled",
            "message": "fine",
            "lastTimestamp": "2026-11-29T11:59:50Z",
        },
        {
            "type": "Warning",
            "reason": "FailedMount",
            "message": 'MountVolume.SetUp failed for volume "models"',
            "lastTimestamp": "2026-11-29T11:59:40Z",
        },
    ]
    view = PodView.of(pod)
    assert pod_problem(view) is None
    assert pod_problem(view, events) == (
        'pod x-decode-0: FailedMount: MountVolume.SetUp failed for volume "models"'
    )
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    listed = {"x-decode-0": PodWarnings(now, tuple(events))}
    assert first_problem([view], listed) == pod_problem(view, events)
    assert first_problem([view], {"other-pod": PodWarnings(now, tuple(events))}) is None
    assert unexplained([view], now) == ["x-decode-0"]
    # Too young to be called stuck, or ready: no lookup.
    assert unexplained([view], datetime(2026, 11, 29, 11, 59, 5, tzinfo=UTC)) == []
    ready = {**pod, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert unexplained([PodView.of(ready)], now) == []


@pytest.mark.parametrize(
    ("waiting", "kind"),
    [
        ("CrashLoopBackOff", "CrashLoopBackOff"),
        ("ImagePullBackOff", "ImagePullBackOff"),
        ("ErrImagePull", "ImagePullBackOff"),
        ("CreateContainerConfigError", "CreateContainerConfigError"),
        ("ContainerCreating", None),
    ],
)
def test_first_fault_names_causes_that_do_not_clear_by_waiting(
    waiting: str, kind: str | None
) -> None:
    pod = _pod(
        "x-decode-0",
        [NOT_READY],
        [{"name": "engine", "state": {"waiting": {"reason": waiting, "message": "m"}}}],
    )
    fault = first_fault([PodView.of(pod)])
    assert (fault[0] if fault else None) == kind
    if fault:
        assert fault[1].startswith("pod x-decode-0 container engine: ")


def test_an_unschedulable_pod_is_a_fault() -> None:
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    fault = first_fault([PodView.of(_pod("x-prefill-0", [scheduled], []))])
    assert fault is not None and fault[0] == "Unschedulable"


def _unschedulable(message: str, node_selector: dict[str, str]) -> Any:
    pod = _pod(
        "x-decode-0",
        [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ],
        [],
    )
    return {**pod, "spec": {"nodeSelector": node_selector}}


def test_no_node_of_the_gpu_product_names_the_label_the_operator_pinned() -> None:
    """The scheduler says no node matched; the message says which label it looked for."""
    message = (
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
        "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    )
    selector = {"nvidia.com/gpu.product": "NVIDIA-H200", "pool": "a"}
    problem = pod_problem(PodView.of(_unschedulable(message, selector)))
    assert problem == (
        "pod x-decode-0: Unschedulable: 0/3 nodes are available: 3 node(s) didn't match Pod's "
        "node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not "
        "helpful for scheduling. The pod needs a node labelled "
        "nvidia.com/gpu.product=NVIDIA-H200 (spec.gpu.product), and pool=a; "
        "`kubectl get nodes -L nvidia.com/gpu.product` shows each node's product"
    )
    # Another cause (too few GPUs, a missing claim) is not about the label: no note.
    other = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert pod_problem(PodView.of(_unschedulable(other, selector))) == (
        f"pod x-decode-0: Unschedulable: {other}"
    )


def test_a_silent_pod_asks_for_a_pass_when_it_becomes_stuck() -> None:
    """No watch event marks the moment a pod has been not ready for STUCK_AFTER_SECONDS with
    nothing in its status: the pass before must ask for one then, or its Events (FailedMount)
    are read only on some later, unrelated pass."""
    pod = silent_pod("2026-11-29T11:59:00Z")
    young = datetime(2026, 11, 29, 11, 59, 4, tzinfo=UTC)
    assert seconds_until_stuck([PodView.of(pod)], young) == 6.0
    # Already stuck (unexplained names it now), ready, or not on a node: nothing to wait for.
    assert seconds_until_stuck([PodView.of(pod)], datetime(2026, 11, 29, 12, 0, tzinfo=UTC)) is None
    ready = {**pod, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    unscheduled = {
        **pod,
        "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "X"}]},
    }
    assert seconds_until_stuck([PodView.of(ready), PodView.of(unscheduled)], young) is None


def test_a_stuck_pods_events_are_due_again_a_minute_after_they_were_listed() -> None:
    """A Warning may come after the listing (a mount that times out after minutes): the next
    listing is due EVENTS_REFRESH_SECONDS after the first of the pods' last ones."""
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    read = {"a": PodWarnings(datetime(2026, 11, 29, 11, 59, 30, tzinfo=UTC)), "b": PodWarnings(now)}
    assert seconds_until_events_due(read, now) == EVENTS_REFRESH_SECONDS - 30
    long_ago = {"a": PodWarnings(datetime(2026, 11, 29, 11, 58, tzinfo=UTC))}
    assert seconds_until_events_due(long_ago, now) == 0
    assert seconds_until_events_due({}, now) is None


def test_a_pass_is_due_a_second_after_the_first_of_the_two_moments() -> None:
    young = PodView.of(silent_pod("2026-11-29T11:59:55Z"))  # stuck in 5 s
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    listed = {"x": PodWarnings(datetime(2026, 11, 29, 11, 59, 2, tzinfo=UTC))}  # due in 2 s
    assert seconds_until_causes_due([young], {}, now) == 6.0
    assert seconds_until_causes_due([young], listed, now) == 3.0
    assert seconds_until_causes_due([], {}, now) is None
