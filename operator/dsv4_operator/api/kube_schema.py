"""The Kubernetes schemas of the free-form pod settings (affinity, topology spread, pod
security context, volumes, env sources), checked offline: `dsv4 validate` then refuses what
the API server would (unknown fields, wrong types), not only the webhook's dry run.

The schemas are package data extracted from kubernetes-validate's strict 1.37 definitions by
`tools/gen_pod_schemas.py` (a test keeps the file current).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

SCHEMA_FILE = "k8s-pod-settings.schema.json"
AFFINITY = "io.k8s.api.core.v1.Affinity"
TOPOLOGY_SPREAD = "io.k8s.api.core.v1.TopologySpreadConstraint"
POD_SECURITY_CONTEXT = "io.k8s.api.core.v1.PodSecurityContext"
VOLUME = "io.k8s.api.core.v1.Volume"
ENV_VAR_SOURCE = "io.k8s.api.core.v1.EnvVarSource"


@cache
def _definitions() -> dict[str, Any]:
    text = resources.files("dsv4_operator.api").joinpath("data", SCHEMA_FILE).read_text()
    definitions: dict[str, Any] = json.loads(text)["$defs"]
    return definitions


@cache
def _validator(definition: str) -> Draft202012Validator:
    # jsonschema here: most specs set no pod settings, and `dsv4 validate` starts without it.
    from jsonschema import Draft202012Validator

    return Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": _definitions()})


def kubernetes_error(definition: str, value: Any) -> str | None:
    """Why `value` is not a valid `definition` (for example `Affinity`), or None."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(definition).iter_errors(value))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return f"{where.lstrip('.') or 'the object'}: {error.message}"
