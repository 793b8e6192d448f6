"""The validating admission webhook: the same rules as the reconcile loop, at the door."""

from __future__ import annotations

from typing import Any

import kopf

from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.names import GROUP, PLURAL, VERSION


def check(spec: dict[str, Any] | None) -> list[str]:
    """Field-prefixed error messages for a spec, empty when it may be admitted."""
    validation = validate_spec(spec or {})
    return [f"{f.field}: [{f.rule}] {f.message}" for f in validation.errors]


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.validate(
        GROUP,
        VERSION,
        PLURAL,
        id="rules",
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    def validate(spec: kopf.Spec, **_: Any) -> None:
        errors = check(dict(spec))
        if errors:
            raise kopf.AdmissionError("; ".join(errors), code=422)
