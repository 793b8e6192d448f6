"""Validates a DSV4Deployment: schema, CEL mirrors, profiles, rules, then the safety policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dsv4_operator.api.cel import broken_spec_rules
from dsv4_operator.api.policy import SafetyPolicy
from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import Finding
from dsv4_operator.engine.ownership import TRANSFER_FORMAT_SPEC_FIELDS
from dsv4_operator.engine.planner import MemoryPlan, PlanningError, plan, resolve_profiles
from dsv4_operator.engine.rules import RULES_BY_ID, context, run_rules
from dsv4_operator.engine.topology import role_topology
from dsv4_operator.names import API_VERSION, KIND
from dsv4_operator.trust import (
    Placement,
    TrustPolicy,
    group_name_findings,
    name_findings,
    spec_trust_findings,
)

SCHEMA_RULE = "schema"


class NotADeployment(ValueError):
    """The document is not a dsv4.io/v1alpha1 DSV4Deployment at all (CLI exit code 2)."""


@dataclass
class Validation:
    """Outcome of validating one object: the parsed spec and plan when they could be built."""

    findings: list[Finding] = field(default_factory=list)
    spec: DSV4DeploymentSpec | None = None
    plan: MemoryPlan | None = None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def valid(self) -> bool:
        return not self.errors

    def rule_ids(self, severity: str = "error") -> list[str]:
        return sorted({f.rule for f in self.findings if f.severity == severity})


def _path(loc: tuple[int | str, ...]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _schema_findings(error: ValidationError) -> list[Finding]:
    findings: list[Finding] = []
    for item in error.errors():
        loc = tuple(item["loc"])
        path = _path(loc)
        if (
            item["type"] == "extra_forbidden"
            and len(loc) >= 3
            and loc[-2] == "overrides"
            and str(loc[-1]) in TRANSFER_FORMAT_SPEC_FIELDS
        ):
            findings.append(
                Finding(
                    rule="DSV4-R011",
                    severity="error",
                    field=path,
                    message=f"{loc[-1]} cannot be overridden per role: it changes the P/D "
                    "transfer format, so prefill and decode must share it. Set "
                    f"{TRANSFER_FORMAT_SPEC_FIELDS[str(loc[-1])]} instead.",
                )
            )
            continue
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = (
                f"unknown field {loc[-1]!r}; check the spelling against `kubectl explain dsv4.spec`"
            )
        elif item["type"] == "missing":
            message = "required field is missing"
        findings.append(Finding(rule=SCHEMA_RULE, severity="error", field=path, message=message))
    return findings


def _cel_mirror(spec: DSV4DeploymentSpec) -> list[Finding]:
    """The CRD's CEL rules, so `dsv4 validate` and the API server agree (see api/cel.py)."""
    return [
        Finding(rule=SCHEMA_RULE, severity="error", field=rule.field, message=rule.message)
        for rule in broken_spec_rules(spec.to_wire())
    ]


def validate_spec(
    raw_spec: Mapping[str, Any],
    where: Placement | None = None,
    policy: TrustPolicy | None = None,
) -> Validation:
    """Validate a spec mapping (as stored in Kubernetes) into findings with the policy applied.

    `where` is the object's name and namespace (names and the own-router URL are checked when
    known); `policy` is the operator's trust configuration (the safest when None).
    """
    where, policy = where or Placement(), policy or TrustPolicy()
    names = name_findings(where.name)
    try:
        spec = DSV4DeploymentSpec.model_validate(raw_spec)
    except ValidationError as error:
        return Validation(findings=[*names, *_schema_findings(error)])
    result = Validation(
        spec=spec,
        findings=[*names, *_cel_mirror(spec), *spec_trust_findings(spec, where, policy)],
    )
    try:
        profiles = resolve_profiles(spec)
    except PlanningError as error:
        result.findings.append(
            Finding(rule=SCHEMA_RULE, severity="error", field=error.field, message=error.message)
        )
        return result
    multi_node = [f"spec.{role}" for role in ROLES if role_topology(spec, role).multi_node]
    result.findings.extend(group_name_findings(where.name, multi_node))
    result.plan = plan(spec)
    ctx = context(spec, profiles, result.plan)
    for rule, hit in run_rules(ctx):
        severity, note = rule.severity, ""
        if severity == "error" and rule.acknowledgeable:
            if spec.safety.policy == SafetyPolicy.WARN:
                severity, note = "warning", " [recorded as a warning: safety.policy is Warn]"
            elif rule.id in spec.safety.acknowledge:
                severity, note = "warning", " [acknowledged in spec.safety.acknowledge]"
        result.findings.append(
            Finding(rule=rule.id, severity=severity, field=hit.field, message=hit.message + note)
        )
    for rule_id in spec.safety.acknowledge:
        acknowledged = RULES_BY_ID.get(rule_id)
        if acknowledged is None or not acknowledged.acknowledgeable:
            what = "is not a rule id" if acknowledged is None else "can never be acknowledged"
            result.findings.append(
                Finding(
                    rule=rule_id,
                    severity="warning",
                    field="spec.safety.acknowledge",
                    message=f"{rule_id} {what}; acknowledging it has no effect.",
                )
            )
    return result


def validate_object(obj: Any, policy: TrustPolicy | None = None) -> Validation:
    """Validate a whole object; raise NotADeployment when it is not a DSV4Deployment."""
    if not isinstance(obj, Mapping):
        raise NotADeployment(f"expected a mapping, got {type(obj).__name__}")
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise NotADeployment(
            f"expected apiVersion {API_VERSION} and kind {KIND}, got "
            f"{obj.get('apiVersion')!r} {obj.get('kind')!r}"
        )
    meta = obj.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        raise NotADeployment(f"metadata must be a mapping, got {type(meta).__name__}")
    name, namespace = meta.get("name"), meta.get("namespace")
    where = Placement(
        name=name if isinstance(name, str) else None,
        namespace=namespace if isinstance(namespace, str) else None,
    )
    raw_spec = obj.get("spec")
    if not isinstance(raw_spec, Mapping):
        return Validation(
            findings=[
                *name_findings(where.name),
                Finding(
                    rule=SCHEMA_RULE,
                    severity="error",
                    field="spec",
                    message="spec is missing or not a mapping",
                ),
            ]
        )
    return validate_spec(raw_spec, where, policy)
