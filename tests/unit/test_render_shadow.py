"""A culprit search's shadow pair: deterministic names, labels nothing serving selects, owned by
the DSV4Deployment, its pods at the bisect PriorityClass, one engine per role, and its own
router (the serving router's renderer) pointed at exactly the probe's engine Services."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.names import (
    DEPLOYMENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROBE_LABEL,
    SHADOW_OF_LABEL,
    shadow_pair,
    shadow_router_name,
    shadow_router_url,
)
from dsv4_operator.render.children import render_spec
from dsv4_operator.render.context import Manifest, OwnerRef
from dsv4_operator.render.shadow import (
    pair_gpus,
    render_shadow_pair,
    render_shadow_router,
    shadow_context,
    shadow_selector,
)
from tests.support.builders import example_doc

GOLDEN = Path(__file__).parent / "golden" / "dsv4-shadow-router.yaml"
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
        m["spec"]["template"]["metadata"]["labels"]
        for m in manifests
        if m["kind"] in ("StatefulSet", "Deployment")
    ]


def _by(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    return next(m for m in manifests if (m["kind"], m["metadata"]["name"]) == (kind, name))


def _engine_urls(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(argv without the engines, the --prefill URLs with their bootstrap ports, the --decode
    URLs)."""
    rest: list[str] = []
    prefill: list[str] = []
    decode: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--prefill":
            prefill.append(f"{argv[i + 1]} {argv[i + 2]}")
            i += 3
        elif argv[i] == "--decode":
            decode.append(argv[i + 1])
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    return rest, prefill, decode


def test_names_are_deterministic_per_probe_and_never_a_serving_name() -> None:
    names = [(m["kind"], m["metadata"]["name"]) for m in _shadow()]
    assert names == [
        ("Service", "dsv4-flash-prefill-bp3"),
        ("StatefulSet", "dsv4-flash-prefill-bp3"),
        ("Service", "dsv4-flash-decode-bp3"),
        ("StatefulSet", "dsv4-flash-decode-bp3"),
        ("Service", "dsv4-flash-router-bp3"),
        ("Deployment", "dsv4-flash-router-bp3"),
    ]
    assert shadow_router_name(NAME, "p3") == "dsv4-flash-router-bp3"
    assert shadow_router_url(NAME, NAMESPACE, "p3", 8000) == (
        "http://dsv4-flash-router-bp3.default.svc:8000"
    )
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
        if m["kind"] in ("StatefulSet", "Deployment"):
            assert m["spec"]["replicas"] == 1
            assert m["spec"]["template"]["spec"]["priorityClassName"] == "dsv4-bisect"
    ctx = shadow_context(NAME, NAMESPACE, "p3", _spec(), OWNER)
    assert pair_gpus(ctx) == ctx.gpus["prefill"] + ctx.gpus["decode"]


@pytest.mark.parametrize("probe_id", ["", "P1", "p-1", "p1234567890"])
def test_a_probe_id_that_cannot_name_objects_is_refused(probe_id: str) -> None:
    with pytest.raises(ValueError, match="probe id"):
        shadow_pair(probe_id)


def test_the_probe_router_targets_exactly_its_own_engine_services() -> None:
    spec = _spec()
    spec = spec.model_copy(update={"router": spec.router.model_copy(update={"replicas": 3})})
    ctx = shadow_context(NAME, NAMESPACE, "p3", spec, OWNER)
    shadow = render_shadow_pair(ctx, "p3", "dsv4-bisect")
    router = _by(shadow, "Deployment", "dsv4-flash-router-bp3")
    assert router["spec"]["replicas"] == 1
    [container] = router["spec"]["template"]["spec"]["containers"]  # no leak tap
    rest, prefill, decode = _engine_urls(container["command"])
    assert "--pd-disaggregation" in rest
    for role, urls in (("prefill", prefill), ("decode", decode)):
        service = _by(shadow, "Service", f"dsv4-flash-{role}-bp3")
        statefulset = _by(shadow, "StatefulSet", f"dsv4-flash-{role}-bp3")
        host = f"{statefulset['metadata']['name']}-0.{service['metadata']['name']}.{NAMESPACE}.svc"
        assert [urlsplit(u.split()[0]).hostname for u in urls] == [host], urls
        assert service["spec"]["clusterIP"] == "None"  # per-pod DNS names resolve
        assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    # The serving router's launch, rendered by the same code: only the engines differ.
    serving = _by(render_spec(NAME, NAMESPACE, spec, OWNER), "Deployment", "dsv4-flash-router")
    serving_argv = serving["spec"]["template"]["spec"]["containers"][0]["command"]
    serving_rest, serving_prefill, serving_decode = _engine_urls(serving_argv)
    assert rest == serving_rest
    assert prefill[0].split()[1] == str(spec.transfer.bootstrap_port)
    assert set(prefill + decode).isdisjoint(serving_prefill + serving_decode)
    assert len(serving_prefill) == 2  # the serving pair's two prefill replicas
    # The Service reaches the router container itself (no tap in front).
    service = _by(shadow, "Service", "dsv4-flash-router-bp3")
    api = next(p for p in service["spec"]["ports"] if p["name"] == "api")
    assert (api["port"], api["targetPort"]) == (spec.router.port, "api")
    assert {p["name"] for p in container["ports"]} >= {"api"}


def test_the_probe_router_is_deleted_with_the_pair_and_selected_as_it() -> None:
    ctx = shadow_context(NAME, NAMESPACE, "p3", _spec(), OWNER)
    router = render_shadow_router(ctx, "p3", "dsv4-bisect")
    assert [m["kind"] for m in router] == ["Service", "Deployment"]
    for m in router:
        # What the driver lists to delete a probe's objects finds the router too.
        assert _selects(shadow_selector(NAME, "p3"), m["metadata"]["labels"])
        assert DEPLOYMENT_LABEL not in m["metadata"]["labels"]
        assert m["metadata"]["ownerReferences"] == [OWNER.as_dict()]
    template = router[1]["spec"]["template"]
    assert template["spec"]["priorityClassName"] == "dsv4-bisect"
    assert DEPLOYMENT_LABEL not in template["metadata"]["labels"]


def _golden_text() -> str:
    ctx = shadow_context(NAME, NAMESPACE, "p3", _spec(), OWNER)
    return yaml.safe_dump_all(render_shadow_router(ctx, "p3", "dsv4-bisect"), sort_keys=True)


def test_golden_shadow_router() -> None:
    assert GOLDEN.read_text() == _golden_text(), (
        "the shadow router changed; if intended, regenerate with "
        "`python -m tests.unit.test_render_shadow` and review the diff"
    )


if __name__ == "__main__":  # regenerate the golden file
    GOLDEN.write_text(_golden_text())
