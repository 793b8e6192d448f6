"""What `dsv4 validate` accepts, the API server accepts: every child the operator renders for
a valid spec passes a server-side dry-run apply (schema, defaulting, the validation a schema
cannot express). Specs are the fuzz test's same-typed mutations of the example, and the
example with a field drawn from the CRD's own schema."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from dsv4_operator.engine.validation import validate_object
from dsv4_operator.render.children import render_spec
from tests.support.builders import example_doc, with_changes
from tests.support.cases import ONE_OF_CASES, VARIANTS
from tests.support.strategies import from_the_crd, gentle

from .cluster_support import dry_run_apply

CASES = 100


@pytest.mark.parametrize("source", ["examples", "crd-schema"])
def test_every_child_of_a_valid_spec_passes_a_server_side_dry_run(
    dyn: Any, namespace: str, source: str, lws_dyn: Any, lws_namespace: str
) -> None:
    checked: list[str] = []
    strategy = gentle() if source == "examples" else from_the_crd()

    @settings(
        max_examples=CASES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(doc=strategy)
    def check(doc: dict[str, Any]) -> None:
        validation = validate_object(doc)
        event("valid" if validation.valid else "invalid")
        if not validation.valid or validation.spec is None:
            return
        for child in render_spec(doc["metadata"]["name"], namespace, validation.spec):
            if child["kind"] == "ServiceMonitor":
                continue  # prometheus-operator's type; its CRD is not part of this plane
            if child["kind"] == "LeaderWorkerSet":  # a multi-node role: the plane with LWS
                moved = {**child, "metadata": {**child["metadata"], "namespace": lws_namespace}}
                dry_run_apply(lws_dyn, lws_namespace, moved)
            else:
                dry_run_apply(dyn, namespace, child)
            checked.append(child["kind"])

    check()
    # The strategy keeps most specs valid; a change that made none valid would test nothing.
    # two engine roles per spec, each a StatefulSet or (spanning nodes) a LeaderWorkerSet
    valid = (checked.count("StatefulSet") + checked.count("LeaderWorkerSet")) // 2
    print(f"{valid} valid specs, {len(checked)} children dry-run applied")
    assert valid >= CASES // 6, valid


def test_pod_settings_pass_a_server_side_dry_run(dyn: Any, namespace: str) -> None:
    """Pull secrets, service account, affinity, spread, security context, an extra volume
    and env from a Secret, per role overrides: the API server accepts every child."""
    doc = example_doc()
    spec = with_changes(doc["spec"], VARIANTS["pod-settings"])
    validation = validate_object({**doc, "spec": spec})
    assert validation.valid and validation.spec is not None, validation.errors
    children = render_spec("dsv4-flash", namespace, validation.spec)
    for child in children:
        if child["kind"] == "ServiceMonitor":
            continue
        dry_run_apply(dyn, namespace, child)
    pods = [c for c in children if c["kind"] in ("StatefulSet", "Deployment")]
    assert all(c["spec"]["template"]["spec"]["serviceAccountName"] == "dsv4-engines" for c in pods)


@pytest.mark.parametrize(
    ("change", "refusal"), [(change, theirs) for change, _, theirs in ONE_OF_CASES]
)
def test_pod_settings_validate_refuses_are_refused_by_the_api_server_too(
    dyn: Any, namespace: str, change: dict[str, Any], refusal: str
) -> None:
    """The one-of rules `dsv4 validate` adds to the schema's (api/pod.py) are the API
    server's own: the same settings in a bare Pod are refused by a dry-run create."""
    doc = example_doc()
    spec = with_changes(doc["spec"], {"podTemplate": change})
    assert not validate_object({**doc, "spec": spec}).valid
    container: dict[str, Any] = {"name": "c", "image": "busybox", "env": change.get("env", [])}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "one-of"},
        "spec": {"containers": [container], "volumes": change.get("volumes", [])},
    }
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    with pytest.raises(Exception) as refused:
        pods.create(body=pod, namespace=namespace, query_params=[("dryRun", "All")])
    assert getattr(refused.value, "status", None) == 422, refused.value
    assert refusal in str(getattr(refused.value, "body", "")), refused.value
