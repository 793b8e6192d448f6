"""The trust boundary: where a namespace user's spec may point the operator and its pods.

A DSV4Deployment is written by whoever may edit objects in its namespace; the operator runs
with cluster-wide rights and fetches URLs from inside the cluster. So every outbound URL and
every node path in a spec is checked against the operator's own configuration (set by the
cluster admin through the chart), never trusted as written. The checks are pure: they return
findings; the webhook, the reconcile pass, the guard and `dsv4 validate` all call them.
docs/security.md describes the boundary for users and admins.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import Finding
from dsv4_operator.api.times import parse_duration
from dsv4_operator.names import (
    MAX_DEPLOYMENT_NAME_LENGTH,
    MAX_GROUP_INDEX,
    MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH,
    NAME_PATTERN,
    STATEFULSET_NAME_LIMIT,
    longest_child_name,
    longest_group_child_name,
    router_name,
)

TRUST_RULE = "trust"
NAME_RULE = "schema"
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NAME_RE = re.compile(NAME_PATTERN)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class TrustPolicy:
    """What the operator's admin allows beyond the defaults (all empty: the safest)."""

    canary_endpoints: tuple[str, ...] = ()
    """URL prefixes a canary may probe besides the deployment's own router Service."""
    prometheus_url: str | None = None
    """The Prometheus the guard queries when a spec has queries but no URL."""
    prometheus_urls: tuple[str, ...] = ()
    """URL prefixes `spec.guard.prometheus.url` may name (the default URL is always allowed)."""
    host_path_prefixes: tuple[str, ...] = ()
    """Node directories `spec.model.cache.hostPath` may name (none: hostPath refused)."""
    cluster_domain: str = "cluster.local"
    min_canary_interval: str = "10s"
    """The shortest `spec.guard.canary.interval` this operator runs."""


@dataclass(frozen=True)
class Placement:
    """Where the object lives; None when unknown (a file checked offline)."""

    name: str | None = None
    namespace: str | None = None


def split_list(text: str) -> tuple[str, ...]:
    """A comma-separated setting as a tuple of non-empty entries."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


# --- names ----------------------------------------------------------------------------------


def name_findings(name: str | None) -> list[Finding]:
    """Object names whose children would break a DNS or label rule (the CRD refuses them too)."""
    if name is None:
        return []
    problem = None
    if not _NAME_RE.match(name):
        problem = (
            "must be a DNS-1035 label: lower-case letters, digits and '-', starting with a "
            "letter and ending with a letter or digit (no dots: it names Services)"
        )
    elif len(name) > MAX_DEPLOYMENT_NAME_LENGTH:
        problem = (
            f"is {len(name)} characters; at most {MAX_DEPLOYMENT_NAME_LENGTH} fit, because the "
            f"longest child, the StatefulSet {longest_child_name(name)!r}, must stay within "
            f"{STATEFULSET_NAME_LIMIT} characters (the 63-character controller-revision-hash "
            "label of its pods)"
        )
    if problem is None:
        return []
    return [Finding(rule=NAME_RULE, severity="error", field="metadata.name", message=problem)]


def group_name_findings(name: str | None, multi_node_fields: Iterable[str]) -> list[Finding]:
    """A multi-node deployment's name too long for its LeaderWorkerSet groups' worker
    StatefulSets (`multi_node_fields`: the spec fields of its multi-node roles, none for a
    single-node deployment, which the shorter bound does not concern)."""
    roles = list(multi_node_fields)
    if name is None or not roles or len(name) <= MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH:
        return []
    message = (
        f"is {len(name)} characters; a deployment with multi-node roles ({', '.join(roles)}) "
        f"may have at most {MAX_MULTI_NODE_DEPLOYMENT_NAME_LENGTH}, because the LeaderWorkerSet "
        f"controller names each group's worker StatefulSet '<LeaderWorkerSet>-<group index>', "
        f"and the longest, {longest_group_child_name(name)!r} (group {MAX_GROUP_INDEX} of a "
        f"BlueGreen pair's prefill), must stay within {STATEFULSET_NAME_LIMIT} characters (the "
        "63-character controller-revision-hash label of its pods); shorten metadata.name"
    )
    return [Finding(rule=NAME_RULE, severity="error", field="metadata.name", message=message)]


# --- URLs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Url:
    scheme: str
    host: str
    port: int
    path: str


def _parse(text: str) -> _Url | str:
    """The URL's parts, or why it cannot be used (a message)."""
    import httpx  # here: `dsv4 validate` of a spec without URLs starts without it

    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, ValueError):
        return "is not a valid URL"
    if url.scheme not in _DEFAULT_PORTS:
        return "must be an http:// or https:// URL"
    if not url.host:
        return "names no host"
    if url.userinfo:
        return "must not carry credentials"
    if url.query or url.fragment:
        return "must not carry a query or fragment"
    port = url.port or _DEFAULT_PORTS[url.scheme]
    return _Url(url.scheme, url.host.lower().rstrip("."), port, url.path or "/")


def _under(url: _Url, prefix: _Url) -> bool:
    if (url.scheme, url.host, url.port) != (prefix.scheme, prefix.host, prefix.port):
        return False
    base = prefix.path.rstrip("/")
    return url.path == prefix.path or url.path.startswith(base + "/") or not base


def url_allowed(text: str, prefixes: Iterable[str]) -> bool:
    """True when `text` lies under one of the URL prefixes (scheme, host, port, path)."""
    url = _parse(text)
    if isinstance(url, str):
        return False
    return any(isinstance(p, _Url) and _under(url, p) for p in map(_parse, prefixes))


def _own_router(url: _Url, spec: DSV4DeploymentSpec, where: Placement, domain: str) -> bool:
    """The deployment's router Service, by any of its in-cluster DNS names."""
    if url.scheme != "http" or url.port != spec.router.port or url.path != "/":
        return False
    first, _, rest = url.host.partition(".")
    # Offline (a file without a name) only the shape of the router's name can be checked.
    expected = router_name(where.name) if where.name is not None else None
    if first != expected and not (expected is None and first.endswith("-router")):
        return False
    if not rest:
        return True
    namespace, _, tail = rest.partition(".")
    if where.namespace is not None and namespace != where.namespace:
        return False
    return bool(_DNS_LABEL.match(namespace)) and tail in ("", "svc", f"svc.{domain}")


def router_service_url(spec: DSV4DeploymentSpec, where: Placement, domain: str) -> str:
    name = router_name(where.name or "<name>")
    return f"http://{name}.{where.namespace or '<namespace>'}.svc.{domain}:{spec.router.port}"


def _canary_findings(
    spec: DSV4DeploymentSpec, where: Placement, policy: TrustPolicy
) -> list[Finding]:
    endpoint = spec.guard.canary.endpoint
    if endpoint is None:
        return []
    field = "spec.guard.canary.endpoint"
    url = _parse(endpoint)
    if isinstance(url, str):
        return [Finding(rule=TRUST_RULE, severity="error", field=field, message=url)]
    if _own_router(url, spec, where, policy.cluster_domain) or url_allowed(
        endpoint, policy.canary_endpoints
    ):
        return []
    own = router_service_url(spec, where, policy.cluster_domain)
    allowed = ", ".join(policy.canary_endpoints) or "none"
    return [
        Finding(
            rule=TRUST_RULE,
            severity="error",
            field=field,
            message=f"the canary may probe only this deployment's router Service ({own}, "
            "the default when the field is unset) or a URL under the operator's allow-list "
            f"(chart value guard.allowedCanaryEndpoints; now: {allowed})",
        )
    ]


def _tap_findings(spec: DSV4DeploymentSpec, policy: TrustPolicy) -> list[Finding]:
    """spec.guard.tap.metricsEndpoints: fetched by the operator, so under the same allow-list
    as a canary endpoint (the default, the router pods' taps, needs none)."""
    findings = []
    for i, endpoint in enumerate(spec.guard.tap.metrics_endpoints):
        field = f"spec.guard.tap.metricsEndpoints[{i}]"
        url = _parse(endpoint)
        if isinstance(url, str):
            findings.append(Finding(rule=TRUST_RULE, severity="error", field=field, message=url))
        elif not url_allowed(endpoint, policy.canary_endpoints):
            allowed = ", ".join(policy.canary_endpoints) or "none"
            findings.append(
                Finding(
                    rule=TRUST_RULE,
                    severity="error",
                    field=field,
                    message="the guard reads only the router pods' taps (the default when the "
                    "field is empty) or a URL under the operator's allow-list (chart value "
                    f"guard.allowedCanaryEndpoints; now: {allowed})",
                )
            )
    return findings


def effective_prometheus_url(spec: DSV4DeploymentSpec, policy: TrustPolicy) -> str | None:
    """The Prometheus the guard queries: the spec's (when allowed) or the operator's."""
    prom = spec.guard.prometheus
    if prom.url is not None:
        return prom.url if prometheus_url_allowed(prom.url, policy) else None
    if prom.leak_rate_query or prom.oom_query:
        return policy.prometheus_url
    return None


def prometheus_url_allowed(url: str, policy: TrustPolicy) -> bool:
    defaults = (policy.prometheus_url,) if policy.prometheus_url else ()
    return url_allowed(url, (*defaults, *policy.prometheus_urls))


def _prometheus_findings(spec: DSV4DeploymentSpec, policy: TrustPolicy) -> list[Finding]:
    prom = spec.guard.prometheus
    field = "spec.guard.prometheus"
    if prom.url is not None:
        parsed = _parse(prom.url)
        if isinstance(parsed, str):
            return [
                Finding(rule=TRUST_RULE, severity="error", field=f"{field}.url", message=parsed)
            ]
        if not prometheus_url_allowed(prom.url, policy):
            allowed = ", ".join(p for p in (policy.prometheus_url, *policy.prometheus_urls) if p)
            return [
                Finding(
                    rule=TRUST_RULE,
                    severity="error",
                    field=f"{field}.url",
                    message="the guard queries only the operator's Prometheus (chart value "
                    "guard.prometheus.url) or a URL under its allow-list (guard.prometheus."
                    f"allowedUrls; now: {allowed or 'none'}); leave the field unset to use "
                    "the operator's",
                )
            ]
        return []
    if (prom.leak_rate_query or prom.oom_query) and not policy.prometheus_url:
        return [
            Finding(
                rule=TRUST_RULE,
                severity="error",
                field=field,
                message="queries are set but the operator has no Prometheus configured "
                "(chart value guard.prometheus.url); ask its admin, or remove the queries",
            )
        ]
    return []


# --- node paths -----------------------------------------------------------------------------


def host_path_allowed(path: str, prefixes: Iterable[str]) -> bool:
    """True when `path` is inside one of the prefixes, compared by whole path components."""
    if ".." in path.split("/"):
        return False
    normal = posixpath.normpath(path)
    for prefix in prefixes:
        base = posixpath.normpath(prefix)
        if normal == base or normal.startswith(base.rstrip("/") + "/"):
            return True
    return False


def _host_path_findings(spec: DSV4DeploymentSpec, policy: TrustPolicy) -> list[Finding]:
    host_path = spec.model.cache.host_path
    if host_path is None or host_path_allowed(host_path.path, policy.host_path_prefixes):
        return []
    allowed = ", ".join(policy.host_path_prefixes)
    what = (
        f"is not under a node directory the operator allows ({allowed})"
        if allowed
        else "is refused: the operator allows no hostPath volumes"
    )
    return [
        Finding(
            rule=TRUST_RULE,
            severity="error",
            field="spec.model.cache.hostPath.path",
            message=f"{host_path.path} {what}; mount the weights from a PVC "
            "(spec.model.cache.pvc), or ask the operator's admin to allow a prefix "
            "(chart value security.hostPathPrefixes)",
        )
    ]


def _interval_findings(spec: DSV4DeploymentSpec, policy: TrustPolicy) -> list[Finding]:
    interval = spec.guard.canary.interval
    # The floor is the operator's setting (a plain string in TrustPolicy), parsed here.
    if interval.delta >= parse_duration(policy.min_canary_interval):
        return []
    return [
        Finding(
            rule=TRUST_RULE,
            severity="error",
            field="spec.guard.canary.interval",
            message=f"{interval} is shorter than this operator's floor of "
            f"{policy.min_canary_interval} (chart value guard.minCanaryInterval): each run "
            "costs the operator and the router; use a longer interval",
        )
    ]


def spec_trust_findings(
    spec: DSV4DeploymentSpec, where: Placement, policy: TrustPolicy
) -> list[Finding]:
    """The spec's outbound URLs and node paths checked against the operator's policy."""
    return [
        *_canary_findings(spec, where, policy),
        *_tap_findings(spec, policy),
        *_interval_findings(spec, policy),
        *_prometheus_findings(spec, policy),
        *_host_path_findings(spec, policy),
    ]
