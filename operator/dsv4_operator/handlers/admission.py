"""The validating admission webhook: the same rules as the reconcile loop, at the door."""

from __future__ import annotations

from typing import Any

import kopf

from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.names import GROUP, PLURAL, VERSION
from dsv4_operator.trust import Placement, TrustPolicy


def check(
    spec: dict[str, Any] | None,
    where: Placement | None = None,
    policy: TrustPolicy | None = None,
) -> list[str]:
    """Field-prefixed error messages for a spec, empty when it may be admitted."""
    validation = validate_spec(spec or {}, where, policy)
    return [f"{f.field}: [{f.rule}] {f.message}" for f in validation.errors]


def register(registry: kopf.OperatorRegistry, policy: TrustPolicy) -> None:
    @kopf.on.validate(
        GROUP,
        VERSION,
        PLURAL,
        id="rules",
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    def validate(spec: kopf.Spec, name: str | None, namespace: str | None, **_: Any) -> None:
        # A generateName'd object has no name yet; the CRD's own rule checks the final one.
        errors = check(dict(spec), Placement(name or None, namespace), policy)
        if errors:
            raise kopf.AdmissionError("; ".join(errors), code=422)
