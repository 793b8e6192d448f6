"""Operator settings from the environment (DSV4_*), with defaults for an in-cluster install."""

from __future__ import annotations

import difflib
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dsv4_operator.api.times import DURATION_PATTERN
from dsv4_operator.names import (
    DEFAULT_BISECT_PRIORITY_CLASS,
    DEFAULT_OPERATOR_IMAGE,
    GROUP,
    OPERATOR,
)
from dsv4_operator.trust import TrustPolicy, split_list

# The longest wait between reads of an idle tap or engine unless DSV4_GUARD_IDLE_READ_SECONDS
# says otherwise (docs/guard.md, "An idle source is read less often").
GUARD_IDLE_READ_SECONDS = 30.0
# Pod page reads in flight across all deployments unless DSV4_GUARD_READS_AT_ONCE says otherwise.
GUARD_READS_AT_ONCE = 32


class OperatorSettings(BaseSettings):
    """Every knob of `dsv4 run`; docs/settings.md lists them (generated)."""

    model_config = SettingsConfigDict(env_prefix="DSV4_", extra="ignore")

    namespaces: str = Field(
        default="", description="Comma-separated namespaces to watch; empty watches all."
    )
    prefix: str = Field(
        default=GROUP,
        description="Prefix of the ValidatingWebhookConfiguration kopf manages in local runs.",
    )
    log_format: Literal["text", "json"] = Field(default="text", description="Log format.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO")
    listen_host: str = Field(
        default="0.0.0.0",
        description="Address the metrics, health and webhook servers bind (`::` on IPv6 clusters).",
    )
    metrics_port: int = Field(default=8080, description="Prometheus /metrics port (0: off).")
    health_port: int = Field(default=8081, description="kopf liveness /healthz port (0: off).")
    webhook: bool = Field(default=False, description="Serve the validating admission webhook.")
    webhook_port: int = Field(default=9443, description="Webhook HTTPS port.")
    webhook_cert_dir: Path | None = Field(
        default=None, description="Directory with tls.crt and tls.key (cert-manager or Helm)."
    )
    webhook_url_host: str | None = Field(
        default=None,
        description="Host the API server dials when kopf manages the webhook configuration "
        "(local runs); unset in-cluster, where the chart owns the configuration.",
    )
    resync_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Full resync period: a backstop only, since watch events, the guard's "
        "rounds and the clock's deadlines each enqueue what they change.",
    )
    workers: int = Field(default=4, ge=1, description="Concurrent reconciles.")
    retry_backoff_max_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Longest wait before a deployment whose reconcile failed is tried again (the "
        "wait doubles from 1 s with each failure; a spec change retries at once). "
        "DSV4ReconcileErrors looks at 10 minutes, twice this.",
    )
    revision_history_limit: int = Field(default=10, ge=1, description="ControllerRevisions kept.")
    field_manager: str = Field(default=OPERATOR, description="Server-side apply manager.")
    canary_endpoint_allow: str = Field(
        default="",
        description="Comma-separated URL prefixes a canary may probe besides the deployment's "
        "own router Service (docs/security.md).",
    )
    bisect_priority_class: str = Field(
        default=DEFAULT_BISECT_PRIORITY_CLASS,
        description="PriorityClass of culprit-search shadow pairs when "
        "spec.guard.bisect.priorityClassName is unset (the chart creates it: below serving, "
        "preemptionPolicy Never; docs/bisect.md).",
    )
    bisect_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="How often a culprit search checks whether a shadow pair and its router are "
        "Ready.",
    )
    prometheus_url: str = Field(
        default="", description="The Prometheus the guard queries when a spec has queries."
    )
    prometheus_url_allow: str = Field(
        default="",
        description="Comma-separated URL prefixes spec.guard.prometheus.url may name.",
    )
    host_path_prefixes: str = Field(
        default="",
        description="Comma-separated node directories spec.model.cache.hostPath may name "
        "(empty: hostPath refused).",
    )
    operator_image: str = Field(
        default=DEFAULT_OPERATOR_IMAGE,
        description="The operator's own image (the chart sets it): the weights download Job "
        "and the leak tap sidecar run it.",
    )
    cluster_domain: str = Field(default="cluster.local", description="The cluster's DNS domain.")
    min_canary_interval: str = Field(
        default="10s",
        pattern=DURATION_PATTERN,
        description="The shortest spec.guard.canary.interval the operator runs.",
    )

    guard_canaries_at_once: int = Field(
        default=64,
        ge=1,
        description="Canary runs in flight at once across all deployments; the others wait "
        "their turn (each deployment's runs are spread over its interval by a phase fixed by "
        "its name, docs/guard.md). A run holds a slot as long as the engine takes to answer "
        "its rounds: keep it above deployments x run seconds / interval seconds "
        "(dsv4_canary_slot_wait_seconds shows runs waiting).",
    )
    guard_reads_at_once: int = Field(
        default=GUARD_READS_AT_ONCE,
        ge=1,
        description="Reads of pods' pages (the leak taps' and engines' /metrics) in flight at "
        "once across all deployments; the others wait their turn, and a read's timeout runs "
        "from when it has a slot, so an operator short of CPU reads late instead of calling "
        "the taps unreachable (dsv4_guard_read_slot_wait_seconds shows reads waiting).",
    )
    guard_idle_read_seconds: float = Field(
        default=GUARD_IDLE_READ_SECONDS,
        ge=1,
        le=300,
        description="The longest wait between two reads of a leak tap or an engine whose last "
        "read found nothing new (reads that find something come every spec interval): how "
        "late the first read after an idle spell may come, against what an idle fleet costs "
        "(60 halves a large idle fleet's tap reads; docs/guard.md).",
    )

    leader_election: bool = Field(
        default=False,
        description="Reconcile and guard only while holding the Lease (several replicas).",
    )
    lease_namespace: str = Field(
        default="default", description="Namespace of the leader-election Lease."
    )
    lease_name: str = Field(default=OPERATOR, description="Name of the leader-election Lease.")
    lease_owner: str = Field(
        default="",
        description="The operator's Deployment, in the Lease's namespace: the Lease names it as "
        "its owner, so deleting the Deployment (helm uninstall) deletes the Lease (empty: no "
        "owner).",
    )
    lease_duration_seconds: float = Field(
        default=15.0,
        ge=3,
        le=300,
        description="How long a standby waits on an unrenewed Lease before taking over; the "
        "holder renews every duration/7.5 and gives up after 2/3 of it.",
    )
    pod_name: str = Field(
        default="", description="This replica's identity in the Lease (default: host and pid)."
    )

    @property
    def liveness_endpoint(self) -> str | None:
        """kopf's /healthz URL on the listen address, or None when the health port is off."""
        if not self.health_port:
            return None
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"http://{host}:{self.health_port}/healthz"

    @property
    def identity(self) -> str:
        return self.pod_name or f"{socket.gethostname()}_{os.getpid()}"

    @property
    def trust_policy(self) -> TrustPolicy:
        return TrustPolicy(
            canary_endpoints=split_list(self.canary_endpoint_allow),
            prometheus_url=self.prometheus_url or None,
            prometheus_urls=split_list(self.prometheus_url_allow),
            host_path_prefixes=split_list(self.host_path_prefixes),
            cluster_domain=self.cluster_domain,
            min_canary_interval=self.min_canary_interval,
        )

    @property
    def namespace_list(self) -> list[str]:
        return [n.strip() for n in self.namespaces.split(",") if n.strip()]


#: DSV4_* variables that other programs of this project read (the weights Job), not `dsv4 run`.
OTHER_PROGRAMS_VARIABLES = frozenset(
    {"DSV4_WEIGHTS_JOB", "DSV4_WEIGHTS_NAMESPACE", "DSV4_WEIGHTS_INTERVAL", "DSV4_TERMINATION_LOG"}
)


def unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """One warning per DSV4_* variable `dsv4 run` does not read, naming the closest setting:
    a misspelt setting is otherwise ignored without a word (names match in any case, as
    pydantic-settings reads them)."""
    known = sorted(f"DSV4_{name.upper()}" for name in OperatorSettings.model_fields)
    warnings = []
    for variable in sorted(environ):
        name = variable.upper()
        if not name.startswith("DSV4_") or name in known or name in OTHER_PROGRAMS_VARIABLES:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.append(f"{variable} is not a setting of dsv4 run and is ignored{hint}")
    return warnings
