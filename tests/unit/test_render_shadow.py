"""A culprit search's shadow pair: deterministic names, labels nothing serving selects, owned by
the DSV4Deployment, its pods at the bisect PriorityClass, one engine per role."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.names import (
    DEPLOYMENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROBE_LABEL,
    SHADOW_OF_LABEL,
    shadow_pair,
)
from dsv4_operator.render.children import render_spec
from dsv4_operator.render.context import Manifest, OwnerRef
from dsv4_operator.render.shadow import (
    pair_gpus,
    render_shadow_pair,
    shadow_context,
    shadow_selector,
)
from tests.support.builders import example_doc

NAME, NAMESPACE = "dsv4-flash", "default"
OWNER = OwnerRef("dsv4.io/v1alpha1", "DSV4Deployment", NAME, "uid-1")


def _spec() -> DSV4DeploymentSpec:
    spec = example_doc()["spec"]
    spec["prefill"]["replicas"] = 2  # the shadow pair still runs one of each
    return DSV4DeploymentSpec.model_validate(spec)


def _shadow(probe_id: str = "p3") -> list[Manifest]:
    ctx = shadow_context(NAME, NAMESPACE, probe_id, _spec(), OWNER)
    return render_shadow_pair(ctx, probe_id, "dsv4-bisect")


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def _pod_labels(manifests: list[Manifest]) -> list[dict[str, str]]:
    return [
        m["spec"]["template"]["metadata"]["labels"] for m in manifests if m["kind"] == "StatefulSet"
    ]


def test_names_are_deterministic_per_probe_and_never_a_serving_name() -> None:
    names = [(m["kind"], m["metadata"]["name"]) for m in _shadow()]
    assert names == [
        ("Service", "dsv4-flash-prefill-bp3"),
        ("StatefulSet", "dsv4-flash-prefill-bp3"),
        ("Service", "dsv4-flash-decode-bp3"),
        ("StatefulSet", "dsv4-flash-decode-bp3"),
    ]
    assert names == [(m["kind"], m["metadata"]["name"]) for m in _shadow()]
    serving = {m["metadata"]["name"] for m in render_spec(NAME, NAMESPACE, _spec(), OWNER)}
    assert serving.isdisjoint(name for _, name in names)
    assert {m["metadata"]["name"] for m in _shadow("p4")}.isdisjoint(n for _, n in names)


def test_nothing_serving_selects_a_shadow_pod_or_service() -> None:
    shadow = _shadow()
    serving = render_spec(NAME, NAMESPACE, _spec(), OWNER)
    selectors: list[Mapping[str, str]] = []
    for m in serving:
        spec = m.get("spec") or {}
        selector = spec.get("selector")
        if isinstance(selector, dict):
            selectors.append(selector.get("matchLabels", selector))
    # The operator's own reads of children and of engine pods select on DEPLOYMENT_LABEL.
    selectors += [{MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: NAME}, {DEPLOYMENT_LABEL: NAME}]
    shadow_labels = [m["metadata"]["labels"] for m in shadow] + _pod_labels(shadow)
    for selector in selectors:
        assert not any(_selects(selector, labels) for labels in shadow_labels), selector
    # ... while the shadow pair's own selectors find its pods, and only its probe's.
    for m in shadow:
        selector = m["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert any(_selects(selector, labels) for labels in _pod_labels(shadow))
        assert not any(_selects(selector, labels) for labels in _pod_labels(_shadow("p4")))
        assert _selects(shadow_selector(NAME, "p3"), m["metadata"]["labels"])
        assert not _selects(shadow_selector(NAME, "p4"), m["metadata"]["labels"])
        assert m["metadata"]["labels"][SHADOW_OF_LABEL] == NAME
        assert m["metadata"]["labels"][PROBE_LABEL] == "p3"


def test_the_pair_is_owned_low_priority_and_one_engine_per_role() -> None:
    for m in _shadow():
        assert m["metadata"]["ownerReferences"] == [OWNER.as_dict()]
        if m["kind"] == "StatefulSet":
            assert m["spec"]["replicas"] == 1
            assert m["spec"]["template"]["spec"]["priorityClassName"] == "dsv4-bisect"
    ctx = shadow_context(NAME, NAMESPACE, "p3", _spec(), OWNER)
    assert pair_gpus(ctx) == ctx.gpus["prefill"] + ctx.gpus["decode"]


@pytest.mark.parametrize("probe_id", ["", "P1", "p-1", "p1234567890"])
def test_a_probe_id_that_cannot_name_objects_is_refused(probe_id: str) -> None:
    with pytest.raises(ValueError, match="probe id"):
        shadow_pair(probe_id)
