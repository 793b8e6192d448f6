"""Helpers for the operator's integration tests: the operator as a real process, and probes."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from dsv4_devcluster import ControlPlane, wait_for
from dsv4_devcluster.process import free_port
from dsv4_operator.engine.effective import parse_args
from dsv4_operator.names import (
    API_VERSION,
    DEPLOYMENT_LABEL,
    FORMAT_LABEL,
    KIND,
    ROLE_LABEL,
    ROUTER,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "dsv4.yaml"
POOL_LABEL = "dsv4-test-pool"
POOL = "operator"
RTX = "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"


def rtx_pool(control_plane: Any, prefix: str, count: int, pool: str = POOL) -> list[str]:
    """`count` 8-GPU RTX PRO nodes named `<prefix>-<i>`, labelled into the test pool `pool`."""
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        control_plane.add_gpu_node(name, gpus=8, product=RTX, labels={POOL_LABEL: pool})
    return names


class OperatorProcess:
    """`dsv4 run` as a subprocess watching one namespace; logs go to a file."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_dir: Path,
        *,
        wrap: Callable[[list[str]], list[str]] | None = None,
        **env: str,
    ) -> None:
        """`wrap` turns the argv into the one to run (a pod's network namespace, say)."""
        self.kubeconfig, self.namespace, self.wrap = kubeconfig, namespace, wrap
        self.metrics_port = int(env.get("DSV4_METRICS_PORT") or free_port())
        self.log_path = log_dir / f"operator-{namespace}-{time.monotonic_ns()}.log"
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "DSV4_NAMESPACES": namespace,
            "DSV4_RESYNC_SECONDS": "2",
            "DSV4_METRICS_PORT": str(self.metrics_port),
            "DSV4_HEALTH_PORT": "0",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        listen = self.env.get("DSV4_LISTEN_HOST", "0.0.0.0")
        self.host = "127.0.0.1" if listen in ("0.0.0.0", "::") else listen

    def start(self) -> OperatorProcess:
        log = self.log_path.open("ab")
        argv = [sys.executable, "-m", "dsv4_operator.cli", "run"]
        self.proc = subprocess.Popen(
            self.wrap(argv) if self.wrap else argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_for(
            "operator metrics endpoint",
            lambda: self.metric("dsv4_reconciles_total") is not None or self.alive_or_raise(),
            timeout=60,
        )
        return self

    def alive_or_raise(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        return False

    def metric(self, name: str, **labels: str) -> float | None:
        """Sum of the samples named `name` whose labels include `labels`, or None when the
        endpoint is not up."""
        try:
            with urllib.request.urlopen(
                f"http://{self.host}:{self.metrics_port}/metrics", timeout=5
            ) as resp:
                text = resp.read().decode()
        except OSError:
            return None
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def passes(self) -> float:
        """Reconcile passes finished so far (0 while the endpoint is not up)."""
        return self.metric("dsv4_reconciles_total") or 0

    def more_passes(self, count: int, timeout: float = 60) -> None:
        """Until the operator has finished `count` more reconcile passes."""
        target = self.passes() + count
        wait_for(f"{count} more reconcile passes", lambda: self.passes() >= target, timeout)

    def settled(self, writes: Callable[[], object] | None = None, timeout: float = 120) -> None:
        """Until two reconcile passes in a row finish with no API write (or no change in
        `writes()`, the writes that matter to the test): what the last change made the
        operator write (status, Events) has landed. Counted in passes, not seconds: a slow
        machine waits longer, a stalled operator fails here."""
        count = writes or (lambda: self.metric("dsv4_api_writes_total"))

        def quiet() -> bool:
            before = count()
            self.more_passes(2)
            return count() == before

        wait_for("two reconcile passes in a row that write nothing", quiet, timeout)

    def series(self, name: str) -> list[dict[str, str]]:
        """The label sets of the samples named `name` the operator exports now."""
        with urllib.request.urlopen(
            f"http://{self.host}:{self.metrics_port}/metrics", timeout=5
        ) as resp:
            text = resp.read().decode()
        return [
            dict(sample.labels)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def kill(self) -> None:
        """SIGKILL: no cleanup, the way a node loss or OOM kill ends it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def webhook_operator(kubeconfig: Path, namespace: str, log_dir: Path) -> OperatorProcess:
    """An operator serving the admission webhook on loopback; kopf keeps the
    ValidatingWebhookConfiguration `dsv4.io.validation` pointing at it (delete it after)."""
    return OperatorProcess(
        kubeconfig,
        namespace,
        log_dir,
        DSV4_WEBHOOK="1",
        DSV4_LISTEN_HOST="127.0.0.1",
        DSV4_WEBHOOK_PORT=str(free_port()),
        DSV4_WEBHOOK_URL_HOST="127.0.0.1",
    ).start()


def example(namespace: str, name: str = "dsv4-flash", **changes: Any) -> dict[str, Any]:
    """The example DSV4Deployment in `namespace`, pinned to the test node pool."""
    doc: dict[str, Any] = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": name, "namespace": namespace}
    for role in ("prefill", "decode"):
        doc["spec"][role]["nodeSelector"] = {POOL_LABEL: POOL}
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = doc["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return doc


class Cluster:
    """Thin, typed-enough access to what the tests read and write."""

    def __init__(self, dyn: Any, namespace: str) -> None:
        self.dyn, self.namespace = dyn, namespace
        self.dsv4 = dyn.resources.get(api_version=API_VERSION, kind=KIND)

    def apply(self, doc: dict[str, Any]) -> None:
        self.dsv4.server_side_apply(
            body=doc, namespace=self.namespace, field_manager="tests", force_conflicts=True
        )

    def get(self, name: str = "dsv4-flash") -> dict[str, Any]:
        obj: dict[str, Any] = self.dsv4.get(name=name, namespace=self.namespace).to_dict()
        return obj

    def items(
        self, api_version: str, kind: str, selector: str | None = None
    ) -> list[dict[str, Any]]:
        res = self.dyn.resources.get(api_version=api_version, kind=kind)
        items: list[dict[str, Any]] = res.get(
            namespace=self.namespace, label_selector=selector
        ).to_dict()["items"]
        return items

    def children(self, name: str = "dsv4-flash") -> dict[tuple[str, str], dict[str, Any]]:
        selector = f"{DEPLOYMENT_LABEL}={name}"
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for api_version, kind in (
            ("apps/v1", "StatefulSet"),
            ("apps/v1", "Deployment"),
            ("v1", "Service"),
            ("policy/v1", "PodDisruptionBudget"),
        ):
            for item in self.items(api_version, kind, selector):
                out[(kind, item["metadata"]["name"])] = item
        return out

    def revisions(self, name: str = "dsv4-flash") -> list[dict[str, Any]]:
        return [
            r
            for r in self.items("apps/v1", "ControllerRevision", f"{DEPLOYMENT_LABEL}={name}")
            if r["metadata"]["ownerReferences"][0]["kind"] == KIND
        ]

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return self.items("v1", "Pod", selector)

    def events(self, name: str = "dsv4-flash") -> list[dict[str, Any]]:
        return [
            e
            for e in self.items("v1", "Event")
            if e["involvedObject"].get("name") == name
            and e["involvedObject"].get("kind") == "DSV4Deployment"
        ]

    def wait_events(
        self, *reasons: str, name: str = "dsv4-flash", timeout: float = 30
    ) -> list[dict[str, Any]]:
        """The deployment's Events once every reason is among them.

        The operator posts Events after the status patch, so a test that has just seen a
        condition waits for the matching Event rather than reading it at once.
        """

        def check() -> list[dict[str, Any]] | None:
            events = self.events(name)
            return events if set(reasons) <= {e["reason"] for e in events} else None

        return wait_for(f"events {sorted(reasons)} on {name}", check, timeout=timeout)

    def wait_phase(
        self,
        phase: str,
        name: str = "dsv4-flash",
        timeout: float = 180,
        revision: str | None = None,
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.get(name)
            status = obj.get("status", {})
            ok = (
                status.get("phase") == phase
                and status.get("observedGeneration") == obj["metadata"]["generation"]
            )
            if revision is not None:
                ok = ok and status.get("currentRevision") == revision
            return obj if ok else None

        return wait_for(f"{name} phase {phase}", check, timeout=timeout)  # type: ignore[no-any-return]

    def router_formats(self, name: str = "dsv4-flash") -> list[set[str]]:
        """For every router pod (terminating ones too), the transfer-format labels of the
        engine pods its arguments target. A set with two formats means that router could feed
        old prefill into new decode (or the reverse): the tests assert it never happens.
        """
        pods = self.pods(f"{DEPLOYMENT_LABEL}={name}")
        by_name = {p["metadata"]["name"]: p for p in pods}
        out = []
        for router in (p for p in pods if p["metadata"]["labels"].get(ROLE_LABEL) == ROUTER):
            command = router["spec"]["containers"][0]["command"]
            targets = [
                command[i + 1].split("//", 1)[1].split(".", 1)[0]
                for i, token in enumerate(command)
                if token in ("--prefill", "--decode")
            ]
            out.append(
                {by_name[t]["metadata"]["labels"][FORMAT_LABEL] for t in targets if t in by_name}
            )
        return out


def watch_router(cluster: Cluster, until: Callable[[], bool], timeout: float = 240) -> int:
    """Poll the router's targets until `until()`; fail on a mixed-format observation."""
    deadline = time.monotonic() + timeout
    observations = 0
    while time.monotonic() < deadline:
        for formats in cluster.router_formats():
            observations += 1
            assert len(formats) <= 1, f"a router targets pods of several formats: {formats}"
        if until():
            return observations
        time.sleep(0.2)
    raise TimeoutError("condition not reached while watching the router")


def engine_flags(sts: dict[str, Any]) -> dict[str, tuple[int, str | None]]:
    return parse_args(sts["spec"]["template"]["spec"]["containers"][0]["command"])


def statefulset_policy(
    dyn: Any, namespace: str, expression: str, message: str, name: str = "policy"
) -> Callable[[], None]:
    """A ValidatingAdmissionPolicy (the API server's own CEL admission, what a cluster's
    policy engine does) on creates, updates and deletes of StatefulSets in `namespace`,
    refusing those where `expression` is false with `message`; returns the undo once the
    policy is in force. Not on `statefulsets/status`: the StatefulSet controller keeps
    working."""
    policies = dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicy"
    )
    bindings = dyn.resources.get(
        api_version="admissionregistration.k8s.io/v1", kind="ValidatingAdmissionPolicyBinding"
    )
    full = f"{name}-{namespace}"
    policies.create(
        body={
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": full},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE", "DELETE"],
                            "resources": ["statefulsets"],
                        }
                    ]
                },
                "validations": [{"expression": expression, "message": message}],
            },
        }
    )
    bindings.create(
        body={
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": full},
            "spec": {
                "policyName": full,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )

    def undo() -> None:
        bindings.delete(name=full)
        policies.delete(name=full)

    # A binding takes effect a moment later: wait until a StatefulSet of 3 replicas (which
    # every policy the tests use refuses) is refused with `message`.
    statefulsets = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    probe = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "policy-probe", "namespace": namespace},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            },
        },
    }

    def in_force() -> bool:
        try:
            statefulsets.create(body=probe, namespace=namespace, dry_run="All")
        except Exception as error:
            return message in str(getattr(error, "body", error))
        return False

    wait_for(f"the policy {full} in force", in_force, timeout=60)
    return undo


def service_account_kubeconfig(cp: ControlPlane, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a TokenRequest token)."""
    api = cp.api_client()
    try:
        request = {"spec": {"expirationSeconds": 3600}}
        token = (
            k8s.CoreV1Api(api)
            .create_namespaced_service_account_token(name, namespace, request)
            .status.token
        )
    finally:
        api.close()
    config = yaml.safe_load(cp.kubeconfig_path.read_text())
    config["users"] = [{"name": name, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = name
    path.write_text(yaml.safe_dump(config))
    return path
