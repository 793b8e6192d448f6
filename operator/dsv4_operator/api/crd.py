"""Generates the DSV4Deployment CustomResourceDefinition from the pydantic models."""

from __future__ import annotations

import copy
import json
from typing import Any

import yaml
from pydantic import BaseModel

from dsv4_operator.api.models import DSV4ModelSpec, DSV4ModelStatus
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.names import (
    API_VERSION,
    GROUP,
    KIND,
    MAX_DEPLOYMENT_NAME_LENGTH,
    MODEL_KIND,
    MODEL_PLURAL,
    MODEL_SHORT_NAMES,
    MODEL_SINGULAR,
    NAME_PATTERN,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)

JsonSchema = dict[str, Any]

# JSON-Schema keys that have no place in a Kubernetes structural schema.
_DROPPED_KEYS = frozenset({"title", "examples", "additionalProperties"})

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Degraded")].reason',
        "description": "The Degraded condition's reason: the fault, or AsExpected",
    },
    {
        "name": "Prefill",
        "type": "integer",
        "jsonPath": ".status.roles.prefill.ready",
        "description": "Ready prefill replicas",
    },
    {
        "name": "Decode",
        "type": "integer",
        "jsonPath": ".status.roles.decode.ready",
        "description": "Ready decode replicas",
    },
    {"name": "Revision", "type": "string", "jsonPath": ".status.currentRevision"},
    {
        "name": "Leak",
        "type": "number",
        "jsonPath": ".status.guard.leakRate",
        "description": "Canary tool-call leak rate",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


# The object's name bounds its children's names (names.py); the API server checks it here,
# the webhook and `dsv4 validate` through trust.name_findings, from the same constants.
# (No fieldPath: the API server accepts only paths into the schema, and metadata has none.)
NAME_RULES: list[dict[str, Any]] = [
    {
        "rule": f"self.metadata.name.matches('{NAME_PATTERN}')",
        "message": "metadata.name must be a DNS-1035 label (lower-case letters, digits and "
        "'-', a letter first, no dots): it names the deployment's Services",
    },
    {
        "rule": f"size(self.metadata.name) <= {MAX_DEPLOYMENT_NAME_LENGTH}",
        "message": f"metadata.name must be at most {MAX_DEPLOYMENT_NAME_LENGTH} characters: "
        "the longest child, a BlueGreen pair's prefill StatefulSet '<name>-prefill-<10-char "
        "hash>', must fit the 52 characters a StatefulSet name may have",
    },
]


DEFAULT_NOTE = "Default: "  # what ends the description of a field with a default


def _default_text(value: object) -> str | None:
    """A default as `kubectl explain` readers write it in YAML; None for none worth stating
    (null, an empty string, or an empty list or object the API server fills from the fields
    below)."""
    if value is None or value in ("", [], {}):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return json.dumps(value, separators=(", ", ": "))


def default_note(node: JsonSchema) -> str | None:
    """What ends the description of a field with a default worth stating ("Default: 60s.")."""
    text = _default_text(node.get("default"))
    return None if text is None else f"{DEFAULT_NOTE}{text}."


def with_default_note(node: JsonSchema) -> JsonSchema:
    """`node` with its default stated at the end of its description: `kubectl explain` prints
    the description but not the schema's `default`."""
    note = default_note(node)
    description = str(node.get("description", "")).strip()
    if note is None or description.endswith(note):
        return node
    return {**node, "description": f"{description} {note}" if description else note}


def without_default_note(node: JsonSchema) -> str:
    """The description of `node` without the note `with_default_note` added (the reference
    shows defaults in a column of their own)."""
    description = str(node.get("description", ""))
    note = default_note(node)
    return description.removesuffix(note).rstrip() if note else description


def _resolve(node: JsonSchema, defs: dict[str, JsonSchema]) -> JsonSchema:
    """Inline `$ref`s, keeping sibling keys (description, default) of the referring node."""
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[-1]])
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        # The referring field's description is more specific than the model's docstring.
        node = {**target, **siblings}
    return node


def structural(node: JsonSchema, defs: dict[str, JsonSchema]) -> JsonSchema:
    """Turn one pydantic JSON-Schema node into a Kubernetes structural schema node."""
    node = _resolve(node, defs)
    out: JsonSchema = {}
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        nullable = len(branches) < len(node["anyOf"])
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if node.get("x-kubernetes-int-or-string"):
            out = {"x-kubernetes-int-or-string": True}
            # String constraints apply to the string form only (OpenAPI `pattern`).
            for branch in branches:
                if branch.get("type") == "string":
                    out.update({k: branch[k] for k in ("pattern", "maxLength") if k in branch})
        elif len(branches) == 1:
            out = structural({**branches[0], **rest}, defs)
            if rest.get("default", "absent") is None:
                out.pop("default", None)
        else:  # pragma: no cover - the models never produce this
            raise ValueError(f"cannot express anyOf {branches} structurally")
        if nullable:
            out["nullable"] = True
        for key in ("description",):
            if key in rest:
                out[key] = rest[key]
        return with_default_note(out)
    for key, value in node.items():
        if key in _DROPPED_KEYS or key == "anyOf":
            continue
        if key == "properties":
            out["properties"] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = structural(value, defs)
        elif key == "const":  # a one-value Literal: OpenAPI v3.0 has no `const`
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        else:
            out[key] = value
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        out["additionalProperties"] = structural(extra, defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if out.get("type") == "object" and "properties" in out:
        required = set(out.get("required", []))
        for name, sub in out["properties"].items():
            # Nested objects with default factories default to {} so the API server fills
            # their own defaults (the same ones pydantic applies).
            if (
                name not in required
                and sub.get("type") == "object"
                and "properties" in sub
                and not sub.get("nullable")
                and "default" not in sub
            ):
                sub["default"] = {}
    return with_default_note(out)


def _spec_and_status(spec_model: type[BaseModel], status_model: type[BaseModel]) -> JsonSchema:
    """The structural schemas of a kind's spec and status, by property name."""
    spec_schema = spec_model.model_json_schema(by_alias=True, mode="validation")
    status_schema = status_model.model_json_schema(by_alias=True, mode="serialization")
    spec = structural(spec_schema, spec_schema.get("$defs", {}))
    spec.pop("$defs", None)
    status = structural(status_schema, status_schema.get("$defs", {}))
    status.pop("$defs", None)
    status.pop("required", None)
    return {"spec": spec, "status": status}


def openapi_schema() -> JsonSchema:
    """The openAPIV3Schema of the CRD's only version."""
    return {
        "type": "object",
        "x-kubernetes-validations": NAME_RULES,
        "description": "A DeepSeek-V4-class model served on SGLang with prefill/decode "
        "disaggregation, validated against known-unsafe engine configurations and guarded "
        "by a tool-call leak canary with automatic rollback.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION},
            "kind": {"type": "string", "description": KIND},
            "metadata": {"type": "object"},
            **_spec_and_status(DSV4DeploymentSpec, DSV4DeploymentStatus),
        },
    }


MODEL_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Repo", "type": "string", "jsonPath": ".spec.repo"},
    {"name": "Revision", "type": "string", "jsonPath": ".spec.revision"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Progress",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="WeightsReady")].reason',
        "description": "The WeightsReady condition's reason",
    },
    {
        "name": "Used-By",
        "type": "string",
        "jsonPath": ".status.usedBy",
        "description": "DSV4Deployments that reference the model",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def model_openapi_schema() -> JsonSchema:
    """The openAPIV3Schema of the DSV4Model CRD."""
    return {
        "type": "object",
        "description": "A model's weights from the Hugging Face Hub, downloaded once into a "
        "claim of its own and shared by the DSV4Deployments that reference it; deleting a "
        "deployment keeps them (docs/models.md).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION},
            "kind": {"type": "string", "description": MODEL_KIND},
            "metadata": {"type": "object"},
            **_spec_and_status(DSV4ModelSpec, DSV4ModelStatus),
        },
    }


def _crd(
    names: JsonSchema, printer: list[dict[str, Any]], schema: JsonSchema, scope: str
) -> JsonSchema:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": names,
            "scope": scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def custom_resource_definition() -> JsonSchema:
    """The whole DSV4Deployment CRD object."""
    names = {
        "kind": KIND,
        "listKind": f"{KIND}List",
        "plural": PLURAL,
        "singular": SINGULAR,
        "shortNames": list(SHORT_NAMES),
        "categories": ["all", "dsv4"],
    }
    return _crd(names, PRINTER_COLUMNS, openapi_schema(), "Namespaced")


def model_custom_resource_definition() -> JsonSchema:
    """The whole DSV4Model CRD object."""
    names = {
        "kind": MODEL_KIND,
        "listKind": f"{MODEL_KIND}List",
        "plural": MODEL_PLURAL,
        "singular": MODEL_SINGULAR,
        "shortNames": list(MODEL_SHORT_NAMES),
        # Not in the `dsv4` category: `kubectl get dsv4` lists the deployments alone, as ever.
    }
    return _crd(names, MODEL_PRINTER_COLUMNS, model_openapi_schema(), "Namespaced")


CRD_KINDS = {KIND: custom_resource_definition, MODEL_KIND: model_custom_resource_definition}


def crd_file_name(kind: str = KIND) -> str:
    """The file under crds/ (and the chart's files/crds/) of a kind's CRD."""
    plural = PLURAL if kind == KIND else MODEL_PLURAL
    return f"{GROUP}_{plural}.yaml"


def crd_yaml(kind: str = KIND) -> str:
    """A CRD as committed in crds/ (stable key order, so drift shows in a diff)."""
    header = "# Generated by `dsv4 crd` from operator/dsv4_operator/api; do not edit.\n"
    return header + yaml.safe_dump(CRD_KINDS[kind](), sort_keys=False, width=100)
