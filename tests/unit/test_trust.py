"""The trust boundary: names, outbound URLs, node paths, bounds, and the smuggling matrix."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from dsv4_operator.api.crd import NAME_RULES, openapi_schema
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import Finding
from dsv4_operator.engine.ownership import OWNED_ENV, TRANSFER_FORMAT_SPEC_FIELDS
from dsv4_operator.engine.validation import validate_object, validate_spec
from dsv4_operator.names import (
    MAX_DEPLOYMENT_NAME_LENGTH,
    NAME_PATTERN,
    STATEFULSET_NAME_LIMIT,
    longest_child_name,
)
from dsv4_operator.signals.prometheus import PrometheusError, instant_value
from dsv4_operator.trust import (
    Placement,
    TrustPolicy,
    effective_prometheus_url,
    host_path_allowed,
    url_allowed,
)
from tests.support.cases import spellings_of_owned_flags

Variant = Callable[..., dict[str, Any]]
HERE = Placement("dsv4-flash", "llm")


def _errors(
    spec: dict[str, Any], where: Placement = HERE, policy: TrustPolicy | None = None
) -> dict[str, Finding]:
    return {f.field: f for f in validate_spec(spec, where, policy).errors}


# --- names ----------------------------------------------------------------------------------


def test_the_longest_name_fills_a_statefulset_name_exactly() -> None:
    name = "a" * MAX_DEPLOYMENT_NAME_LENGTH
    assert len(longest_child_name(name)) == STATEFULSET_NAME_LIMIT == 52
    assert MAX_DEPLOYMENT_NAME_LENGTH == 33


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("a" * 34, "at most 33"),
        ("a" * 63, "at most 33"),
        ("dsv4.flash", "DNS-1035"),
        ("Dsv4", "DNS-1035"),
        ("4flash", "DNS-1035"),
        ("flash-", "DNS-1035"),
    ],
)
def test_names_that_break_a_child_are_refused_with_the_limit(
    name: str, why: str, variant: Variant
) -> None:
    errors = _errors(variant({}), Placement(name, "llm"))
    assert why in errors["metadata.name"].message


@pytest.mark.parametrize("name", ["a", "dsv4-flash", "a" * 33, "x1-y2"])
def test_names_whose_children_fit_are_accepted(name: str, variant: Variant) -> None:
    assert "metadata.name" not in _errors(variant({}), Placement(name, "llm"))


def test_the_crd_checks_names_with_the_same_constants() -> None:
    rules = " ".join(r["rule"] for r in openapi_schema()["x-kubernetes-validations"])
    assert openapi_schema()["x-kubernetes-validations"] == NAME_RULES
    assert f"matches('{NAME_PATTERN}')" in rules
    assert f"size(self.metadata.name) <= {MAX_DEPLOYMENT_NAME_LENGTH}" in rules


def test_a_file_with_a_list_as_metadata_is_not_a_deployment(example_doc: dict[str, Any]) -> None:
    from dsv4_operator.engine.validation import NotADeployment

    with pytest.raises(NotADeployment, match="metadata must be a mapping"):
        validate_object({**example_doc, "metadata": ["x"]})


# --- canary endpoint ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://dsv4-flash-router:8000",
        "http://dsv4-flash-router.llm:8000/",
        "http://dsv4-flash-router.llm.svc:8000",
        "http://dsv4-flash-router.llm.svc.cluster.local:8000",
    ],
)
def test_the_own_router_service_may_be_named(endpoint: str, variant: Variant) -> None:
    assert "spec.guard.canary.endpoint" not in _errors(variant({"guard.canary.endpoint": endpoint}))


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://kubernetes.default.svc:443",
        "http://other-router.llm.svc:8000",
        "http://dsv4-flash-router.other-namespace.svc:8000",
        "http://dsv4-flash-router.llm.svc.evil.example:8000",
        "http://dsv4-flash-router.llm.svc:8001",
        "https://dsv4-flash-router.llm.svc:8000",
        "http://dsv4-flash-router.llm.svc:8000@evil.example",
        "http://user:pw@dsv4-flash-router.llm.svc:8000",
        "http://dsv4-flash-router.llm.svc:8000/admin",
        "http://dsv4-flash-router.llm.svc:8000/?x=1",
        "file:///etc/passwd",
        "not a url",
    ],
)
def test_any_other_canary_endpoint_is_refused(endpoint: str, variant: Variant) -> None:
    finding = _errors(variant({"guard.canary.endpoint": endpoint}))["spec.guard.canary.endpoint"]
    assert finding.rule == "trust"


def test_the_operator_allow_list_opens_exactly_its_prefixes(variant: Variant) -> None:
    policy = TrustPolicy(canary_endpoints=("http://canary.example:9000/llm",))
    ok = variant({"guard.canary.endpoint": "http://canary.example:9000/llm/v1"})
    assert "spec.guard.canary.endpoint" not in _errors(ok, policy=policy)
    for other in ("http://canary.example:9000/llmx", "http://canary.example:9001/llm"):
        bad = variant({"guard.canary.endpoint": other})
        message = _errors(bad, policy=policy)["spec.guard.canary.endpoint"].message
        assert "guard.allowedCanaryEndpoints" in message and "canary.example:9000/llm" in message


def test_url_prefixes_compare_parsed_parts_not_text() -> None:
    assert url_allowed("http://a.example/x/y", ["http://a.example/x"])
    assert not url_allowed("http://a.example.evil/x", ["http://a.example"])
    assert not url_allowed("http://a.example@evil.example/", ["http://a.example"])
    assert url_allowed("http://A.Example:80/", ["http://a.example"])


def test_the_canary_interval_floor_is_the_operators(variant: Variant) -> None:
    spec = variant({"guard.canary.interval": "2s"})
    message = _errors(spec)["spec.guard.canary.interval"].message
    assert "10s" in message and "guard.minCanaryInterval" in message
    assert "spec.guard.canary.interval" not in _errors(
        spec, policy=TrustPolicy(min_canary_interval="1s")
    )


# --- Prometheus -----------------------------------------------------------------------------


def test_a_spec_cannot_name_its_own_prometheus(variant: Variant) -> None:
    spec = variant({"guard.prometheus": {"url": "http://10.0.0.1:9090", "leakRateQuery": "x"}})
    assert _errors(spec)["spec.guard.prometheus.url"].rule == "trust"
    allowed = TrustPolicy(prometheus_urls=("http://10.0.0.1:9090",))
    assert "spec.guard.prometheus.url" not in _errors(spec, policy=allowed)


def test_queries_use_the_operators_prometheus(variant: Variant) -> None:
    raw = variant({"guard.prometheus": {"leakRateQuery": "sum(x)"}})
    assert "queries are set" in _errors(raw)["spec.guard.prometheus"].message
    policy = TrustPolicy(prometheus_url="http://prometheus.monitoring.svc:9090")
    assert _errors(raw, policy=policy) == {}
    spec = DSV4DeploymentSpec.model_validate(raw)
    assert effective_prometheus_url(spec, policy) == "http://prometheus.monitoring.svc:9090"
    assert effective_prometheus_url(spec, TrustPolicy()) is None


SECRET = b"s3cr3t-token-from-the-reply"


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (500, SECRET, "HTTP 500"),
        (200, b'{"status":"error","errorType":"bad_data","error":"' + SECRET + b'"}', "bad_data"),
        (200, b'{"status":"error","errorType":"' + SECRET + b'"}', "query failed"),
        (200, b"<html>" + SECRET, "not a Prometheus query result"),
        (200, b'{"status":"success","data":{"result":"' + SECRET + b'"}}', "not a Prometheus"),
    ],
)
async def test_prometheus_errors_never_quote_the_reply(
    status: int, body: bytes, message: str
) -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/query"
        return httpx.Response(status, content=body, headers={"Content-Type": "application/json"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(reply)) as client:
        with pytest.raises(PrometheusError) as error:
            await instant_value(client, "http://prometheus.test", "sum(x)")
    assert message in str(error.value)
    assert SECRET.decode() not in str(error.value)


# --- node paths -----------------------------------------------------------------------------


def test_host_path_is_refused_unless_the_operator_allows_its_prefix(variant: Variant) -> None:
    spec = variant({"model.cache": {"hostPath": {"path": "/"}}})
    message = _errors(spec)["spec.model.cache.hostPath.path"].message
    assert "allows no hostPath" in message and "spec.model.cache.pvc" in message
    allowed = TrustPolicy(host_path_prefixes=("/mnt/models",))
    assert "spec.model.cache.hostPath.path" in _errors(spec, policy=allowed)
    fine = variant({"model.cache": {"hostPath": {"path": "/mnt/models/dsv4"}}})
    assert "spec.model.cache.hostPath.path" not in _errors(fine, policy=allowed)


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/mnt/models", True),
        ("/mnt/models/", True),
        ("/mnt/models/a/b", True),
        ("/mnt/models2", False),
        ("/mnt/models/../../etc", False),
        ("/mnt", False),
        ("/", False),
    ],
)
def test_host_path_prefixes_match_whole_components(path: str, allowed: bool) -> None:
    assert host_path_allowed(path, ["/mnt/models"]) is allowed


# --- bounds ---------------------------------------------------------------------------------


def _leaves(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, sub in node.get("properties", {}).items():
        yield from _leaves(sub, f"{path}.{name}")
    if "items" in node:
        yield from _leaves(node["items"], f"{path}[]")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _leaves(extra, f"{path}{{}}")
    yield path, node


def test_every_number_string_and_list_of_the_spec_is_bounded() -> None:
    spec = openapi_schema()["properties"]["spec"]
    unbounded = []
    for path, node in _leaves(spec, "spec"):
        kind = node.get("type")
        if node.get("x-kubernetes-int-or-string"):
            continue  # a quantity: its string form has a pattern and maxLength, see below
        if kind in ("integer", "number") and "maximum" not in node:
            unbounded.append(path)
        if kind == "string" and "enum" not in node and "maxLength" not in node:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node and "enum" not in node.get("items", {}):
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
    assert unbounded == []


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("guard.canary.sessions", 2_000_000, "less than or equal to 64"),
        ("guard.canary.rounds", 1000, "less than or equal to 16"),
        ("decode.replicas", 2_147_483_647, "less than or equal to 128"),
        ("router.replicas", 1000, "less than or equal to 32"),
        ("guard.canary.interval", "0s", "at least 1s"),
        ("guard.canary.interval", "25h", "at most 24h"),
        ("guard.oom.window", "99999999999999999999h", "at most 12 characters"),
        ("guard.oom.window", "9999999999h", "should match pattern"),
        ("guard.bakeTime", "999999999h", "at most 168h"),
        ("gpu.memoryGiB", float("inf"), "finite number"),
        ("gpu.memoryGiB", float("nan"), "finite number"),
        ("engine.env", [{"name": "CAFÉ", "value": "x"}], "should match pattern"),
        ("decode.resources", {"requests": {"memory": "lots"}}, "should match pattern"),
        ("decode.resources", {"limits": {"cpu": -1}}, "greater than or equal to 0"),
    ],
)
def test_out_of_range_values_are_refused_with_the_field(
    field: str, value: Any, message: str, variant: Variant
) -> None:
    findings = validate_spec(variant({field: value})).errors
    assert findings, field
    assert all(f.rule == "schema" for f in findings)
    assert any(field.split(".")[-1] in f.field and message in f.message for f in findings), [
        (f.field, f.message) for f in findings
    ]


def test_duration_bounds_are_the_crds_cel_rules() -> None:
    interval = openapi_schema()["properties"]["spec"]["properties"]["guard"]["properties"][
        "canary"
    ]["properties"]["interval"]
    assert [r["rule"] for r in interval["x-kubernetes-validations"]] == [
        "duration(self) >= duration('1s')",
        "duration(self) <= duration('24h')",
    ]


# --- the smuggling matrix -------------------------------------------------------------------


def _attempts(base: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every way a spec could try to set what the operator owns: each spelling of each owned
    flag in engine.extraArgs and in each role's overrides, each owned env name in engine.env
    and in each role's overrides, and each transfer-format field as a role override."""
    for version, token in spellings_of_owned_flags():
        for where in ("engine", "prefill.overrides", "decode.overrides"):
            spec = copy.deepcopy(base)
            spec["engine"].update(sglangVersion=version, capabilities=[])
            node = spec["engine"] if where == "engine" else spec[where.split(".")[0]]
            if where != "engine":
                node = node.setdefault("overrides", {})
            node["extraArgs"] = [token, "1"]
            yield f"flag {token} in {where}.extraArgs ({version})", spec
    for name in OWNED_ENV:
        for where in ("engine", "prefill.overrides", "decode.overrides"):
            spec = copy.deepcopy(base)
            node = spec["engine"] if where == "engine" else spec[where.split(".")[0]]
            if where != "engine":
                node = node.setdefault("overrides", {})
            node["env"] = [{"name": name, "value": "1"}]
            yield f"env {name} in {where}.env", spec
    for field in TRANSFER_FORMAT_SPEC_FIELDS:
        for role in ("prefill", "decode"):
            spec = copy.deepcopy(base)
            spec[role].setdefault("overrides", {})[field] = "bfloat16"
            yield f"override {role}.overrides.{field}", spec


def test_no_smuggling_attempt_is_accepted(variant: Variant) -> None:
    attempts = list(_attempts(variant({})))
    assert len(attempts) > 3000
    accepted = [what for what, spec in attempts if validate_spec(spec, HERE).valid]
    assert accepted == []
