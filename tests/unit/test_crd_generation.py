"""The committed CRD is generated from the models, structural, and explains itself."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import yaml

from dsv4_operator.api.crd import crd_yaml, custom_resource_definition
from dsv4_operator.api.spec import DSV4DeploymentSpec
from tests.support.paths import REPO

CRD_FILE = REPO / "crds" / "dsv4.io_dsv4deployments.yaml"


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _version() -> dict[str, Any]:
    version: dict[str, Any] = custom_resource_definition()["spec"]["versions"][0]
    return version


def test_committed_crd_matches_models() -> None:
    assert CRD_FILE.read_text() == crd_yaml(), (
        "crds/ drifted: run `dsv4 crd > " + str(CRD_FILE.relative_to(REPO)) + "`"
    )


def test_schema_is_structural() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        for banned in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "title"):
            assert banned not in node, f"{path} has {banned}"
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        if node.get("additionalProperties") is False:
            raise AssertionError(f"{path}: additionalProperties false is not structural")


def test_every_spec_field_has_a_description() -> None:
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [
        p
        for p, node in _walk(spec)
        if p and not p.endswith(("[]", "{}")) and not node.get("description")
    ]
    assert missing == []


def test_kubectl_explain_states_each_default() -> None:
    """`kubectl explain` prints a field's description, not its schema default: the committed
    CRD (and so the chart's copy) ends each description with the default it applies."""
    schema = yaml.safe_load(CRD_FILE.read_text())["spec"]["versions"][0]["schema"]
    spec = schema["openAPIV3Schema"]["properties"]["spec"]
    fields = dict(_walk(spec))
    assert fields[".guard.canary.interval"]["description"].endswith(" Default: 60s.")
    assert fields[".model.cache.pvc.readOnly"]["description"].endswith(" Default: true.")
    assert fields[".engine.memFractionStatic"]["description"].endswith(" Default: 0.85.")
    unstated = [
        path
        for path, node in fields.items()
        if node.get("default") not in (None, "", [], {})
        and f"Default: {node['default']}".lower() not in node["description"].lower()
    ]
    assert unstated == []


def test_names_subresource_and_printer_columns() -> None:
    crd = custom_resource_definition()
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["dsv4"] and names["plural"] == "dsv4deployments"
    assert crd["spec"]["scope"] == "Namespaced"
    assert _version()["subresources"] == {"status": {}}
    columns = [c["name"] for c in _version()["additionalPrinterColumns"]]
    assert columns == ["Phase", "Reason", "Prefill", "Decode", "Revision", "Leak", "Age"]


def test_cel_rules_present() -> None:
    schema = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    rules += [
        r["rule"]
        for r in schema["properties"]["model"]["properties"]["cache"]["x-kubernetes-validations"]
    ]
    assert (
        "[has(self.pvc), has(self.hostPath), has(self.huggingFace), has(self.model)]"
        ".filter(x, x).size() == 1" in rules
    )
    assert "self.workload.contextTokens <= self.engine.contextLength" in rules


def test_crd_defaults_equal_model_defaults() -> None:
    """Defaults the API server fills in are the ones pydantic applies (one source)."""
    spec_schema = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    minimal = {
        "model": {"name": "m", "cache": {"hostPath": {"path": "/m"}}},
        "engine": {"image": "i", "sglangVersion": "0.5.23"},
    }
    wire = DSV4DeploymentSpec.model_validate(minimal).to_wire()

    def check(node: dict[str, Any], value: Any, path: str) -> None:
        if "default" in node and node["default"] != {}:
            assert node["default"] == value, path
        for name, sub in node.get("properties", {}).items():
            if isinstance(value, dict) and name in value:
                check(sub, value[name], f"{path}.{name}")

    check(spec_schema, wire, "spec")


def _server_defaults(node: dict[str, Any], value: Any) -> Any:
    """What the API server stores for `value` under a structural schema: each absent property
    with a `default` gets it, and defaulting goes on inside what was filled in."""
    if isinstance(value, dict) and "properties" in node:
        for name, sub in node["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _server_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in node:
        return [_server_defaults(node["items"], item) for item in value]
    return value


def _differences(ours: Any, theirs: Any, path: str) -> list[str]:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return [
            d
            for key in sorted(set(ours) | set(theirs))
            for d in _differences(ours.get(key), theirs.get(key), f"{path}.{key}")
        ]
    same = ours == theirs or {repr(ours), repr(theirs)} in ({"None", "{}"}, {"None", "[]"})
    return [] if same else [f"{path}: API server {ours!r}, operator {theirs!r}"]


def test_the_api_server_stores_every_default_the_operator_assumes() -> None:
    """A minimal spec, defaulted by the CRD's schema as the API server does it, is exactly the
    spec the operator's models make of it: no nested object whose defaults live only in a
    pydantic default factory (the CRD would store `{}` and the fields would go missing)."""
    spec_schema = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    minimal = {
        "model": {"name": "m", "cache": {"hostPath": {"path": "/m"}}},
        "engine": {"image": "i", "sglangVersion": "0.5.23"},
        "guard": {"tap": {}, "canary": {}},
    }
    stored = _server_defaults(spec_schema, copy.deepcopy(minimal))
    wire = DSV4DeploymentSpec.model_validate(minimal).to_wire()
    differences = _differences(stored, wire, "spec")
    assert not differences, "\n".join(differences)


def test_example_validates_against_crd_types() -> None:
    doc = yaml.safe_load((REPO / "examples" / "dsv4.yaml").read_text())
    wire: dict[str, Any] = DSV4DeploymentSpec.model_validate(doc["spec"]).to_wire()
    assert wire["engine"]["indexKDtype"] == "fp8"
