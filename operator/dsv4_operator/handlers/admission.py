"""The validating admission webhook: the same rules as the reconcile loop, at the door, and
the API server's own verdict on the children the spec renders."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import Finding
from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.kube.errors import KubeError
from dsv4_operator.names import GROUP, PLURAL, VERSION
from dsv4_operator.runtime.webhook import ADMISSION_HANDLER_ID
from dsv4_operator.trust import Placement, TrustPolicy

# (name, namespace, spec) -> the children the API server refuses, "<Kind> <name>: <why>".
DryRun = Callable[[str, str, DSV4DeploymentSpec], Awaitable[list[str]]]


async def check(
    spec: dict[str, Any] | None,
    where: Placement | None = None,
    policy: TrustPolicy | None = None,
    dry_run: DryRun | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
) -> tuple[list[str], list[str]]:
    """Field-prefixed error messages for a spec (empty when it may be admitted), and its
    warnings (admitted, shown by kubectl as `Warning:` lines).

    With `dry_run`, a spec the rules accept is also rendered and its children dry-run
    created: "valid" then means the API server accepts what the operator will write. A dry
    run that cannot be made (API server unreachable, RBAC) admits on the rules alone.
    """
    validation = validate_spec(spec or {}, where, policy)
    errors = [_line(f) for f in validation.errors]
    warnings = [_line(f) for f in validation.findings if f.severity == "warning"]
    if errors or dry_run is None or validation.spec is None or where is None:
        return errors, warnings
    if not (where.name and where.namespace):
        return [], warnings  # a generateName'd object: its children's names are not known yet
    try:
        refused = await dry_run(where.name, where.namespace, validation.spec)
    except KubeError as error:
        (logger or logging.getLogger(__name__)).warning(
            "admitted on the rules alone: the children's dry run failed: %s", error
        )
        return [], warnings
    return [f"spec: renders {r} (the API server refuses it)" for r in refused], warnings


def _line(finding: Finding) -> str:
    return f"{finding.field}: [{finding.rule}] {finding.message}"


def register(
    registry: kopf.OperatorRegistry, policy: TrustPolicy, dry_run: DryRun | None = None
) -> None:
    @kopf.on.validate(
        GROUP,
        VERSION,
        PLURAL,
        id=ADMISSION_HANDLER_ID,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )
    async def validate(
        spec: kopf.Spec,
        name: str | None,
        namespace: str | None,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        warnings: list[str],
        **_: Any,
    ) -> None:
        # A generateName'd object has no name yet; the CRD's own rule checks the final one.
        where = Placement(name or None, namespace)
        errors, found = await check(dict(spec), where, policy, dry_run, logger)
        if errors:
            raise kopf.AdmissionError("; ".join(errors), code=422)
        warnings.extend(found)  # admitted: kubectl prints each as a `Warning:` line
