"""`dsv4-demo` (`make demo`): the product's story on the playground, every step a real command.

1. The operator installed by its Helm chart (webhook and leader election on) and
   examples/dsv4-sglang-0.5.23.yaml (upstream SGLang 0.5.23, a public image) reaching Ready.
2. An unsafe change (bf16 index-K with HiCache, DSV4-R001) denied by the admission webhook.
3. A change that passes validation (more concurrent requests) but leaks: the engines are the
   engine test double, told to corrupt tool calls when started with that setting; the guard's
   canary sees it and rolls back by itself (decision time, quarantine, `kubectl describe`).
4. The leak-rate series and the alerts read from a real Prometheus scraping the operator's pods
   with the chart's alert rules (durations shortened; said on screen).

Each `$ command` printed is run as it reads (bash, with the playground's KUBECONFIG and PATH)
and its output follows. The playground (testsupport/dsv4_devcluster/playground.py) says which
parts are real and which are stand-ins.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dsv4_devcluster import wait_for
from dsv4_devcluster.deployments import baked_revision
from dsv4_devcluster.playground import Playground, describe_parts, devtools
from dsv4_devcluster.prometheus import PodTarget, PrometheusProcess, scale_rules, scrape_job

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/dsv4-sglang-0.5.23.yaml"  # public parts: upstream 0.5.23
NAME = "dsv4-flash-upstream"
RULES = REPO / "charts" / "dsv4-operator" / "files" / "dsv4.rules.yaml"
RULES_SCALE = 300  # `for: 5m` -> 1s, `[10m]` -> 2s: the demo's leak lasts seconds, not minutes
LEAKY_FLAG = "--max-running-requests=96"
# What the engine double is told (its documented knobs, dsv4_engine_double/config.py): corrupt
# 20% of responses of any engine started with LEAKY_FLAG; clean otherwise.
# 20% of responses of any engine started with LEAKY_FLAG; clean otherwise; 20 ms a request
# (demo pacing: the canary's runs take a fraction of a second).
ENGINE_TOLD = {
    "DSV4_DOUBLE_LEAK_WHEN": LEAKY_FLAG,
    "DSV4_DOUBLE_LEAK_RATE": "0.2",
    "DSV4_DOUBLE_LATENCY_MS": "20",
}
INSTALL = (
    "helm install dsv4-operator charts/dsv4-operator -n dsv4-system --create-namespace"
    " --set image.repository=registry.example.com/dsv4-operator --set image.tag=0.1.0"
    " --set guard.minCanaryInterval=1s --set operator.resyncSeconds=5"
)
CLAIM = """kubectl apply -f - <<'EOF'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: dsv4-weights, namespace: default}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
EOF"""
# Demo pacing: a canary run every second of 16 sessions per rank (defaults: 60s, 9), a 5s bake
# (default 10m), and a verdict on 300 responses (default 30) so the leak is in Prometheus for
# a few runs before the rollback.
PACING = (
    '{"spec":{"guard":{"bakeTime":"5s","canary":{"interval":"1s","sessionsPerRank":16},'
    '"leakRate":{"minSamples":300}}}}'
)
UNSAFE = '{"spec":{"engine":{"indexKDtype":"bf16","hicache":{"enabled":true}}}}'
LEAKY = '{"spec":{"engine":{"maxRunningRequests":96,"cudaGraphMaxBs":96}}}'
OPERATOR_PODS = "app.kubernetes.io/name=dsv4-operator"
SERVICE_MONITOR = (
    "helm template dsv4-operator charts/dsv4-operator -n dsv4-system"
    " --set metrics.serviceMonitor.enabled=true"
    " --api-versions monitoring.coreos.com/v1/ServiceMonitor"
    " --show-only templates/servicemonitor.yaml"
)
ALERTS = "DSV4LeakRateHigh|DSV4RollbackPerformed|DSV4ConfigQuarantined"


class Demo:
    """The running story: the playground, the environment commands run with, the clock."""

    def __init__(self, playground: Playground, began: float) -> None:
        self.pg, self.began = playground, began
        promtool = Path(devtools().promtool().path)
        env = playground.env()
        self.env = {**os.environ, **env, "PATH": f"{promtool.parent}:{env['PATH']}"}

    def say(self, line: str) -> None:
        print(f"[demo {time.monotonic() - self.began:5.1f}s] {line}", flush=True)

    def run(self, command: str, expect_ok: bool = True) -> subprocess.CompletedProcess[str]:
        """`command` in bash with the playground's environment: printed, run, output shown."""
        print(f"\n$ {command}", flush=True)
        done = subprocess.run(
            ["bash", "-c", command], cwd=REPO, env=self.env, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        print((done.stdout + done.stderr).rstrip(), flush=True)
        if expect_ok and done.returncode != 0:
            raise RuntimeError(f"`{command}` failed with exit code {done.returncode}")
        return done

    def deployment(self) -> dict[str, Any]:
        api = self.pg.cp.dynamic_client().resources.get(
            api_version="dsv4.io/v1alpha1", kind="DSV4Deployment"
        )
        found: dict[str, Any] = api.get(name=NAME, namespace="default").to_dict()
        return found

    def status(self) -> dict[str, Any]:
        return self.deployment().get("status") or {}

    def until(self, what: str, check: Callable[[], Any], timeout: float = 180) -> Any:
        return wait_for(what, check, timeout=timeout)


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def install_and_ready(demo: Demo) -> str:
    demo.say("1. The operator from its chart (webhook, leader election), then the upstream example")
    demo.run(INSTALL)
    demo.run("kubectl -n dsv4-system rollout status deploy/dsv4-operator --timeout=5m")
    demo.say("a claim for the weights (the playground's default StorageClass provisions it)")
    demo.run(CLAIM)
    demo.run(f"kubectl apply -f {EXAMPLE}")
    demo.say(
        "demo pacing: a canary run every 1s (default 60s) of 16 sessions per rank (9), bake 5s "
        "(10m), a verdict on 300 responses (30)"
    )
    demo.run(f"kubectl patch dsv4 {NAME} --type merge -p '{PACING}'")
    started = time.monotonic()
    demo.run(f"kubectl wait dsv4/{NAME} --for=jsonpath='{{.status.phase}}'=Ready --timeout=5m")
    demo.say(f"Ready {time.monotonic() - started:.1f}s after the apply; waiting for it to bake")

    good: str = demo.until(
        "the revision baked (last known good)", lambda: baked_revision(demo.deployment())
    )
    demo.run(f"kubectl get dsv4 {NAME}")
    return good


def start_prometheus(demo: Demo, workdir: Path) -> PrometheusProcess:
    demo.say("4. A real Prometheus (Debian's 2.42) scraping the operator's pods")
    found = demo.run(
        f"kubectl -n dsv4-system get pods -l {OPERATOR_PODS} "
        "-o jsonpath='{range .items[*]}{.metadata.name} {.status.podIP}{\"\\n\"}{end}'"
    )
    targets = [
        PodTarget(f"{ip}:8080", "dsv4-system", pod, "dsv4-operator")
        for pod, ip in (line.split() for line in found.stdout.splitlines() if line.strip())
    ]
    demo.say("scraped as the chart's ServiceMonitor says (honorLabels), every 1s (chart: 30s)")
    [monitor] = [d for d in yaml.safe_load_all(demo.run(SERVICE_MONITOR).stdout) if d]
    [endpoint] = monitor["spec"]["endpoints"]
    job = scrape_job("dsv4-operator", endpoint, targets)
    rules = scale_rules(RULES, workdir / "dsv4.rules.yaml", RULES_SCALE)
    demo.say(
        f"alert rules: the chart's {RULES.relative_to(REPO)} with every duration divided by "
        f"{RULES_SCALE} (DSV4LeakRateHigh `for: 5m` -> 1s) so the demo's seconds-long leak shows"
    )
    binary = Path(devtools().prometheus().path)
    prom = PrometheusProcess(binary, workdir, [job], [rules]).start()
    demo.say(f"prometheus at {prom.url}, scraping {', '.join(t.address for t in targets)}")
    return prom


def deny_unsafe(demo: Demo) -> None:
    demo.say("2. An unsafe change: bf16 index-K with HiCache (the incident's race, DSV4-R001)")
    refused = demo.run(f"kubectl patch dsv4 {NAME} --type merge -p '{UNSAFE}'", expect_ok=False)
    if refused.returncode == 0:
        raise RuntimeError("the webhook let the unsafe change through")
    demo.say("denied by the admission webhook; nothing changed")


def leak_and_rollback(demo: Demo, good: str) -> None:
    demo.say("3. A change that passes validation: 96 concurrent requests instead of 64")
    demo.say(
        "the engines are the engine TEST DOUBLE (no GPU here), told through its knobs: "
        + " ".join(f"{k}={shlex.quote(v)}" for k, v in ENGINE_TOLD.items())
        + f" (20% of tool-calling responses corrupted by any engine started with {LEAKY_FLAG})"
    )
    demo.run(f"kubectl patch dsv4 {NAME} --type merge -p '{LEAKY}'")
    changed = time.monotonic()
    demo.say("accepted; the operator rolls it out, the guard's canary probes it every second")

    served: list[float] = []  # when both roles first ran the new revision, ready

    def rolled_back() -> dict[str, Any] | None:
        status = demo.status()
        roles = (status.get("roles") or {}).values()
        if (
            not served
            and roles
            and all(r.get("revision") not in (None, good) and r.get("ready") for r in roles)
        ):
            served.append(time.monotonic())
        return status if _condition(status, "RolledBack").get("status") == "True" else None

    status = demo.until("the guard's rollback", rolled_back, timeout=240)
    decided = time.monotonic()
    condition = _condition(status, "RolledBack")
    since_served = f", {decided - served[0]:.1f}s after it served" if served else ""
    demo.say(
        f"the guard rolled back by itself {decided - changed:.1f}s after the change was accepted"
        f"{since_served} (RolledBack at {condition.get('lastTransitionTime')}): "
        f"{condition.get('message')}"
    )
    demo.run(f"kubectl get dsv4 {NAME} -o jsonpath='{{.status.quarantine}}' | python3 -m json.tool")
    demo.until(
        "the last known good revision served again",
        lambda: demo.status().get("phase") == "RolledBack",
    )
    demo.run(f"kubectl get dsv4 {NAME}")
    demo.run(f"kubectl describe dsv4 {NAME}")


def show_prometheus(demo: Demo, prom: PrometheusProcess) -> None:
    demo.say("4. What Prometheus recorded: the leak rate per revision and the alerts")

    def alert_seen() -> bool:
        firing = prom.query('ALERTS{alertname="DSV4LeakRateHigh"}[5m]')
        return any(s["metric"].get("alertstate") == "firing" for s in firing)

    try:
        demo.until("DSV4LeakRateHigh to have fired in Prometheus", alert_seen, timeout=30)
    except TimeoutError:
        seen = False  # the queries below still show what Prometheus holds
    else:
        seen = True
    url = prom.url
    demo.run(f"promtool query instant {url} 'max_over_time(dsv4_leak_rate[5m])'")
    demo.run(
        f"promtool query instant {url} "
        f'\'max_over_time(ALERTS{{alertname=~"{ALERTS}",alertstate="firing"}}[5m])\''
    )
    demo.say("and now, after the rollback (DSV4LeakRateHigh resolved: no leaking revision served):")
    demo.run(f"promtool query instant {url} 'ALERTS{{alertname=~\"{ALERTS}\"}}'")
    if not seen:
        raise RuntimeError("DSV4LeakRateHigh never fired in Prometheus")


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="dsv4-demo",
        description=__doc__,
        epilog="Needs the Kubernetes binaries (`make k8s-binaries`) and the dev tools "
        "(`make tools`); `make demo` fetches both.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    began = time.monotonic()

    def say(line: str) -> None:
        print(f"[playground {time.monotonic() - began:5.1f}s] {line}", flush=True)

    with (
        tempfile.TemporaryDirectory(prefix="dsv4-demo-") as workdir,
        Playground(say=say, extra_env=ENGINE_TOLD) as playground,
    ):
        print("What runs here:", *describe_parts(), sep="\n")
        demo = Demo(playground, began)
        good = install_and_ready(demo)
        prom = start_prometheus(demo, Path(workdir))
        try:
            deny_unsafe(demo)
            leak_and_rollback(demo, good)
            show_prometheus(demo, prom)
        finally:
            prom.stop()
    print(f"[demo] done in {time.monotonic() - began:.1f}s; playground stopped, nothing left")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
