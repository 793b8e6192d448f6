"""The label vocabulary of every metric series about a DSV4Deployment, defined once.

Every exporter labels a deployment's series the same way, so they join: the operator
(metrics.py), the leak tap (`dsv4 tap`), and the engines' `sglang:*` series, which get the
same labels from the scrape (the ServiceMonitor the operator renders relabels them, see
`engine_relabelings`). The alert rules, the dashboard and the docs group and select on
these names (tools/gen_docs.py writes the table into docs/metrics.md and the rules file's
header; tests/chart checks the rules and the dashboard against it).
"""

from __future__ import annotations

from typing import Any

from dsv4_operator.names import DEPLOYMENT_LABEL, ROLE_LABEL

NAMESPACE = "namespace"
DEPLOYMENT = "deployment"
REVISION = "revision"
ROLE = "role"

# On every series about one DSV4Deployment, first and in this order.
SCOPE = (NAMESPACE, DEPLOYMENT)

MEANING = {
    NAMESPACE: "the DSV4Deployment's namespace (on the engines' series: the pod's, set by "
    "prometheus-operator from the target)",
    DEPLOYMENT: "the DSV4Deployment's name, bare (never `namespace/name`)",
    REVISION: "the bare revision hash (status.currentRevision), where a series is about one",
    ROLE: "prefill, decode or router: on the engines' and the router's series (relabelled from "
    f"the pod label `{ROLE_LABEL}`) and on `dsv4_oom_events_total`",
}


def scope_labels(namespace: str, name: str) -> dict[str, str]:
    """The SCOPE labels of the deployment `namespace`/`name` (to select or remove its series)."""
    return {NAMESPACE: namespace, DEPLOYMENT: name}


def _pod_label_meta(label: str) -> str:
    """Prometheus's meta label for a pod label: every character not [a-zA-Z0-9_] becomes _."""
    return "__meta_kubernetes_pod_label_" + "".join(
        c if c.isalnum() or c == "_" else "_" for c in label
    )


def engine_relabelings() -> list[dict[str, Any]]:
    """A ServiceMonitor endpoint's `relabelings` for the engines and the router, which export
    their series without our labels: `deployment` and `role` from the pod's labels
    (prometheus-operator's `namespace` target label is the pod's namespace already). A new
    list each call (a manifest shares no objects: YAML would write them as aliases)."""
    return [
        {"sourceLabels": [_pod_label_meta(label)], "targetLabel": target, "action": "replace"}
        for label, target in ((DEPLOYMENT_LABEL, DEPLOYMENT), (ROLE_LABEL, ROLE))
    ]
