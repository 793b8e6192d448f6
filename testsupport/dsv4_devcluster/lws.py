"""The real LeaderWorkerSet controller (sigs.k8s.io/lws) on the host, for multi-node roles.

``ControlPlane(with_lws=True)`` installs LWS's CRDs (LeaderWorkerSet, DisaggregatedSet) with
its own before kube-controller-manager starts, then calls :func:`start`, which

1. signs a serving certificate for ``127.0.0.1`` with the harness CA (:mod:`.pki`) into the
   manager's certificate directory: its internal certificate management is off (it would
   write a Secret for a Service the API server could not reach here);
2. writes the manager's ``Configuration`` (leader election off, webhook server, metrics and
   health probes on free loopback ports) and runs ``lws-controller-manager`` against the API
   server with the admin kubeconfig;
3. applies the release's webhook configurations (``config/webhook``: manifests plus the pod
   webhooks' ``objectSelector`` patches, named ``lws-*`` as its ``config/default`` does), each
   ``clientConfig.service`` replaced by ``url: https://127.0.0.1:<port><path>`` and the CA
   bundle, so the API server calls the manager directly;
4. waits until the API server really calls both webhooks: a server-side dry run of a
   LeaderWorkerSet comes back defaulted by the mutating one and an invalid one is refused by
   the validating one.

The LeaderWorkerSet CRD's ``conversion`` patch in the release is left out: the CRD serves one
version (v1), so there is nothing to convert. The process is stopped with the control plane
and its files live in the control plane's data dir.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dsv4_devcluster import binaries as _binaries
from dsv4_devcluster import pki as _pki
from dsv4_devcluster.process import ManagedProcess, free_port, wait_for

MANAGER = "lws-controller-manager"
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
DISAGGREGATED_SET_API_VERSION = "disaggregatedset.x-k8s.io/v1"
#: The validating webhook refuses this annotation on an LWS without ``subGroupPolicy``; the
#: CRD schema cannot, so a refusal proves the webhook ran.
SUBGROUP_EXCLUSIVE_ANNOTATION = "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology"
#: ``config/default`` of the release prefixes every object with this.
NAME_PREFIX = "lws-"
WEBHOOK_PATCHES = {
    "MutatingWebhookConfiguration": "mutating-patch.yaml",
    "ValidatingWebhookConfiguration": "validating-patch.yaml",
}
#: A namespace that always exists, for the readiness dry runs.
PROBE_NAMESPACE = "default"

Spawn = Callable[[str, list[str], dict[str, str]], ManagedProcess]


class LwsError(RuntimeError):
    """The LWS manifests are unusable or the manager did not come up; says which."""


@dataclass(frozen=True)
class LwsEndpoints:
    """Where the running manager listens (all on 127.0.0.1)."""

    webhook_port: int
    metrics_port: int
    health_port: int


def crd_paths(bins: _binaries.Binaries) -> list[Path]:
    """The release's CRD files (LeaderWorkerSet, DisaggregatedSet), sorted."""
    paths = sorted((bins.lws_manifests() / "crd").glob("*.yaml"))
    if not paths:
        raise LwsError(f"no LWS CRDs under {bins.lws_manifests() / 'crd'}; run tools/build-k8s.sh")
    return paths


def manager_configuration(endpoints: LwsEndpoints, cert_dir: Path) -> dict[str, Any]:
    """The manager's ``config.lws.x-k8s.io/v1alpha1`` Configuration for the harness."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": endpoints.webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": f"127.0.0.1:{endpoints.metrics_port}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{endpoints.health_port}"},
    }


def _apply_replace_patch(doc: dict[str, Any], ops: Sequence[dict[str, Any]]) -> None:
    """Apply the release's JSON patches (only ``replace`` of a ``/webhooks/<i>`` entry)."""
    for op in ops:
        parts = str(op.get("path", "")).strip("/").split("/")
        if op.get("op") != "replace" or len(parts) != 2 or parts[0] != "webhooks":
            raise LwsError(f"unsupported webhook patch {op!r}: expected replace /webhooks/<i>")
        doc["webhooks"][int(parts[1])] = copy.deepcopy(op["value"])


def webhook_configurations(
    manifests: Path, webhook_port: int, ca_bundle: bytes
) -> list[dict[str, Any]]:
    """The release's webhook configurations, pointing at ``https://127.0.0.1:<port>``."""
    webhook_dir = manifests / "webhook"
    docs = [d for d in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()) if d]
    ca = base64.b64encode(ca_bundle).decode()
    for doc in docs:
        patch = webhook_dir / WEBHOOK_PATCHES[doc["kind"]]
        if patch.is_file():
            _apply_replace_patch(doc, yaml.safe_load(patch.read_text()))
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{webhook_port}{path}",
                "caBundle": ca,
            }
    return docs


def probe_lws(name: str, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A minimal LeaderWorkerSet of one pod per group (for dry runs and tests)."""
    template = {"spec": {"containers": [{"name": "main", "image": "registry.invalid/probe"}]}}
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 1, "workerTemplate": template}},
    }


def server_dry_run(dyn: Any, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    """Create ``body`` with ``dryRun=All``: the API server runs schema validation, defaulting
    and every admission webhook, stores nothing, and returns the object it would have stored.
    Raises ``kubernetes.client.exceptions.ApiException`` (422, 400, ...) with its reasons."""
    resource = dyn.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    ns = namespace or body.get("metadata", {}).get("namespace")
    result: dict[str, Any] = resource.create(body=body, namespace=ns, dry_run="All").to_dict()
    return result


def _webhooks_active(dyn: Any) -> bool:
    """True once the API server calls both LWS webhooks (see the module docstring, step 4)."""
    from kubernetes.client.exceptions import ApiException

    defaulted = server_dry_run(dyn, probe_lws("lws-harness-probe"), PROBE_NAMESPACE)
    if not defaulted["spec"].get("networkConfig", {}).get("subdomainPolicy"):
        return False
    invalid = probe_lws("lws-harness-probe", annotations={SUBGROUP_EXCLUSIVE_ANNOTATION: "x"})
    try:
        server_dry_run(dyn, invalid, PROBE_NAMESPACE)
    except ApiException as exc:
        return "vleaderworkerset.kb.io" in str(exc.body)
    return False


def start(
    bins: _binaries.Binaries,
    pki: _pki.Pki,
    data_dir: Path,
    kubeconfig: Path,
    spawn: Spawn,
    dynamic_client: Callable[[], Any],
    timeout: float,
) -> ManagedProcess:
    """Start the manager, register its webhooks, wait until the API server calls them."""
    endpoints = LwsEndpoints(free_port(), free_port(), free_port())
    lws_dir = data_dir / "lws"
    cert_dir = lws_dir / "certs"
    _pki.issue_serving_cert(
        pki, cert_dir / "tls.crt", cert_dir / "tls.key", "lws-webhook", ("127.0.0.1",)
    )
    config = lws_dir / "config.yaml"
    config.write_text(yaml.safe_dump(manager_configuration(endpoints, cert_dir)))
    argv = [str(bins.path(MANAGER)), f"--config={config}", "--zap-devel=false"]
    proc = spawn(MANAGER, argv, {"KUBECONFIG": str(kubeconfig)})

    def healthy() -> bool:
        url = f"http://127.0.0.1:{endpoints.health_port}/healthz"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return bool(resp.status == 200)

    wait_for(f"{MANAGER} /healthz", healthy, timeout, interval=0.5, process=proc)
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))

    def webhook_serving() -> bool:
        # Any HTTP answer over TLS verified by the harness CA: the API server will get one too.
        url = f"https://127.0.0.1:{endpoints.webhook_port}/healthz"
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(url, timeout=5, context=ctx).close()
        return True

    wait_for(f"{MANAGER} webhook server", webhook_serving, timeout, interval=0.5, process=proc)
    dyn = dynamic_client()
    try:
        for doc in webhook_configurations(
            bins.lws_manifests(), endpoints.webhook_port, pki.ca_cert.read_bytes()
        ):
            resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            resource.server_side_apply(
                body=doc,
                name=doc["metadata"]["name"],
                field_manager="dsv4-devcluster",
                force_conflicts=True,
            )
        wait_for(
            "the API server calling the LWS webhooks",
            lambda: _webhooks_active(dyn),
            timeout,
            interval=0.5,
            process=proc,
        )
    finally:
        dyn.client.close()
    return proc
