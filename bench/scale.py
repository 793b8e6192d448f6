"""Benchmark: the operator at N = 10, 100, 1,000 DSV4Deployments on a real control plane.

For each N, on a fresh control plane (etcd, kube-apiserver, controller-manager; no scheduler,
so engine pods stay Pending: a state that does not change, and children are what is counted):

1. floor: a plain client server-side applies the manifests `dsv4 render` gives for N
   deployments (namespace `plain`, the operator's number of workers in flight) and times until
   all N x 9 children exist;
2. operator: `dsv4 run` watching namespace `op`; N DSV4Deployments created at once; time until
   their N x 9 children exist, and the ratio to the floor;
3. idle with the operator (`--idle` seconds, once nobody has written to those kinds for 10 s,
   the controller-manager's engine pods included): the
   operator's CPU, RSS, API calls by verb (its own counters) and writes; the API server's
   CPU and the requests it answered on the operator's resource types;
4. one spec change (`engine.maxRunningRequests` of one deployment): time until the decode
   StatefulSet carries the new revision;
5. idle without the operator (same length): the API server's CPU, for the with/without ratio.

Figures come from /proc (CPU = utime + stime, RSS = VmRSS), the operator's /metrics and the
API server's own `apiserver_request_total`. Children are counted from metadata-only watches.

    python bench/scale.py [--sizes 10,100,1000] [--idle 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dsv4_devcluster import ControlPlane
from dsv4_devcluster.deployments import example
from dsv4_devcluster.operator import OperatorProcess
from dsv4_operator.kube.client import KubeClient, http_client_for, load_configuration
from dsv4_operator.kube.resources import (
    DEPLOYMENT,
    PDB,
    SERVICE,
    STATEFULSET,
    Resource,
)
from dsv4_operator.runtime.watched import WATCHED

REPO = Path(__file__).resolve().parents[1]

CHILDREN_PER_DEPLOYMENT = 9  # 2 StatefulSets + 3 Services + 1 Deployment + 3 PDBs
CHILD_KINDS = (STATEFULSET, DEPLOYMENT, SERVICE, PDB)
# Every kind the operator reads (its watch cache's list), and the Events it posts.
OPERATOR_RESOURCES = (*(w.resource.plural for w in WATCHED), "events")
WORKERS = 4  # the operator's default (DSV4_WORKERS); the floor keeps as many applies in flight
READ_VERBS = ("GET", "LIST", "WATCH")
# The controller-manager's default 20 requests/s would take minutes to create the engine
# pods of 1,000 deployments; the figures are the operator's, not that queue's.
CONTROLLER_MANAGER = {"kube-api-qps": "500", "kube-api-burst": "1000"}
# Two router Services per deployment (plain and operator) need a ClusterIP each: more than the
# dev cluster's /24 holds at N = 1,000.
API_SERVER = {"service-cluster-ip-range": "10.0.0.0/16"}
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
TICK = os.sysconf("SC_CLK_TCK")


# --- what a process costs ---------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (/proc/<pid>/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def apiserver_pid(cp: ControlPlane) -> int:
    return next(p.pid for p in cp.processes if p.name == "kube-apiserver")


# --- counting children ------------------------------------------------------------------------


@dataclass
class ChildCounter:
    """Names of the child objects seen in one namespace, fed by metadata-only watches."""

    http: httpx.AsyncClient
    namespace: str
    seen: set[tuple[str, str]] = field(default_factory=set)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        for res in CHILD_KINDS:
            listed = await self.http.get(
                res.path(self.namespace), headers={"Accept": METADATA_LIST}
            )
            listed.raise_for_status()
            body = listed.json()
            self.seen |= {(res.kind, i["metadata"]["name"]) for i in body.get("items") or []}
            version = body["metadata"]["resourceVersion"]
            self.tasks.append(asyncio.create_task(self._watch(res, version)))

    async def _watch(self, res: Resource, version: str) -> None:
        params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
        async with self.http.stream(
            "GET",
            res.path(self.namespace),
            params=params,
            headers={"Accept": METADATA_ONLY},
            timeout=None,
        ) as stream:
            async for line in stream.aiter_lines():
                event = json.loads(line)
                if event["type"] == "ADDED":
                    self.seen.add((res.kind, event["object"]["metadata"]["name"]))

    async def until(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.seen) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.seen)}/{count} children in {self.namespace}")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


# --- the two ways of creating children ----------------------------------------------------------


def deployments(namespace: str, n: int) -> list[dict[str, Any]]:
    return [example(namespace, name=f"dsv4-{i:04d}") for i in range(n)]


def rendered(namespace: str, n: int) -> list[dict[str, Any]]:
    """Every child of N deployments, by the operator's own `dsv4 render`."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(deployments(namespace, n), f)
        f.flush()
        out = subprocess.run(
            [sys.executable, "-m", "dsv4_operator.cli", "render", "-f", f.name],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    return [d for d in yaml.safe_load_all(out) if d["kind"] != "ServiceMonitor"]


async def bounded(limit: int, calls: Iterable[Any]) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(call: Any) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(c) for c in calls))


async def timed_children(http: httpx.AsyncClient, namespace: str, n: int, create: Any) -> float:
    counter = ChildCounter(http, namespace)
    await counter.start()
    start = time.monotonic()
    await create()
    await counter.until(n * CHILDREN_PER_DEPLOYMENT, timeout=60 + n * 2)
    elapsed = time.monotonic() - start
    await counter.stop()
    return elapsed


# --- one size -----------------------------------------------------------------------------------


@dataclass
class Figures:
    n: int
    floor_s: float = 0.0
    operator_s: float = 0.0
    settle_s: float = 0.0
    idle_cpu_s: float = 0.0
    rss_mb: float = 0.0
    calls: dict[str, float] = field(default_factory=dict)
    writes: float = 0.0
    server_requests: dict[str, float] = field(default_factory=dict)
    server_cpu_with_s: float = 0.0
    server_cpu_without_s: float = 0.0
    change_s: float = 0.0
    creation: dict[str, float] = field(default_factory=dict)
    floor_server_cpu_s: float = 0.0
    creation_server_cpu_s: float = 0.0
    creation_cpu_s: float = 0.0


def operator_counts(operator: OperatorProcess) -> dict[str, float]:
    def value(name: str, **labels: str) -> float:
        got = operator.metric(name, **labels)
        return got if got is not None else float("nan")

    return {
        "list": value("dsv4_api_reads_total", verb="list"),
        "get": value("dsv4_api_reads_total", verb="get"),
        "watch lists": value("dsv4_watch_lists_total"),
        "writes": value("dsv4_api_writes_total"),
        "passes": value("dsv4_reconciles_total"),
    }


def server_counts(cp: ControlPlane) -> dict[str, float]:
    by_verb: dict[str, float] = {}
    for (verb, resource), value in cp.request_counts().items():
        if resource in OPERATOR_RESOURCES:
            by_verb[verb] = by_verb.get(verb, 0.0) + value
    return by_verb


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


def quiet(cp: ControlPlane, seconds: float = 10.0, timeout: float = 1800.0) -> float:
    """Wait until nobody (operator, controller-manager) has written to the operator's kinds
    for `seconds`; returns the time waited."""

    def writes() -> float:
        return sum(v for verb, v in server_counts(cp).items() if verb not in READ_VERBS)

    start = last_change = time.monotonic()
    last = writes()
    while time.monotonic() - last_change < seconds:
        if time.monotonic() - start > timeout:
            raise TimeoutError("the cluster kept writing")
        time.sleep(1)
        now = writes()
        if now != last:
            last, last_change = now, time.monotonic()
    return last_change - start


async def revision_of(client: KubeClient, namespace: str, name: str) -> str | None:
    sts = await client.get(STATEFULSET, namespace, f"{name}-decode")
    return None if sts is None else sts["metadata"]["labels"].get("dsv4.io/revision")


async def measure(n: int, idle: float, resync: float | None, logs: Path) -> Figures:
    figures = Figures(n)
    crd = REPO / "crds" / "dsv4.io_dsv4deployments.yaml"
    with ControlPlane(
        crds=[crd],
        extra_apiserver_args=API_SERVER,
        extra_controller_manager_args=CONTROLLER_MANAGER,
    ) as cp:
        cfg = load_configuration(str(cp.kubeconfig_path))
        client = KubeClient(http_client_for(cfg, timeout=120), field_manager="bench")
        namespaces = cp.dynamic_client().resources.get(api_version="v1", kind="Namespace")
        for ns in ("plain", "op"):
            namespaces.create(body={"metadata": {"name": ns}})
        manifests = rendered("plain", n)
        server_cpu = cpu_seconds(apiserver_pid(cp))
        figures.floor_s = await timed_children(
            client.http,
            "plain",
            n,
            lambda: bounded(WORKERS, (client.apply(m) for m in manifests)),
        )
        figures.floor_server_cpu_s = cpu_seconds(apiserver_pid(cp)) - server_cpu
        print(
            f"N={n}: floor {figures.floor_s:.1f}s, API server CPU "
            f"{figures.floor_server_cpu_s:.1f}s",
            flush=True,
        )
        await asyncio.to_thread(quiet, cp)  # the floor's engine pods are all created

        operator = OperatorProcess(cp.kubeconfig_path, "op", logs)
        if resync is None:
            del operator.env["DSV4_RESYNC_SECONDS"]  # the operator's own default
        else:
            operator.env["DSV4_RESYNC_SECONDS"] = str(resync)
        operator.start()
        assert operator.proc is not None
        pid = operator.proc.pid
        try:
            docs = deployments("op", n)
            server_cpu, cpu = cpu_seconds(apiserver_pid(cp)), cpu_seconds(pid)
            figures.operator_s = await timed_children(
                client.http,
                "op",
                n,
                lambda: bounded(16, (client.apply(d) for d in docs)),
            )
            text = (
                urllib.request.urlopen(
                    f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5
                )
                .read()
                .decode()
            )
            figures.creation = {
                f"{s.labels.get('verb')} {s.labels.get('resource')}": s.value
                for fam in text_string_to_metric_families(text)
                for s in fam.samples
                if s.name in ("dsv4_api_writes_total", "dsv4_api_reads_total")
            }
            figures.creation["passes"] = operator.metric("dsv4_reconciles_total") or 0
            figures.creation_server_cpu_s = cpu_seconds(apiserver_pid(cp)) - server_cpu
            figures.creation_cpu_s = cpu_seconds(pid) - cpu
            print(
                f"N={n}: operator {figures.operator_s:.1f}s, API server CPU "
                f"{figures.creation_server_cpu_s:.1f}s, operator CPU "
                f"{figures.creation_cpu_s:.1f}s; {figures.creation}",
                flush=True,
            )
            figures.settle_s = await asyncio.to_thread(quiet, cp)

            ops, srv = operator_counts(operator), server_counts(cp)
            cpu, server_cpu = cpu_seconds(pid), cpu_seconds(apiserver_pid(cp))
            await asyncio.sleep(idle)
            figures.idle_cpu_s = cpu_seconds(pid) - cpu
            figures.server_cpu_with_s = cpu_seconds(apiserver_pid(cp)) - server_cpu
            figures.calls = delta(operator_counts(operator), ops)
            figures.writes = figures.calls.get("writes", 0.0)
            figures.server_requests = delta(server_counts(cp), srv)
            figures.rss_mb = rss_mb(pid)
            print(
                f"N={n}: settled in {figures.settle_s:.0f}s; idle {figures.calls} "
                f"server {figures.server_requests}",
                flush=True,
            )

            target = docs[n // 2]
            name = target["metadata"]["name"]
            old = await revision_of(client, "op", name)
            target["spec"]["engine"]["maxRunningRequests"] = 48
            start = time.monotonic()
            await client.apply(target)
            while await revision_of(client, "op", name) == old:
                if time.monotonic() - start > 300:
                    raise TimeoutError(f"{name}: the change never reached its StatefulSet")
                await asyncio.sleep(0.02)
            figures.change_s = time.monotonic() - start
        finally:
            operator.stop()
        server_cpu = cpu_seconds(apiserver_pid(cp))
        await asyncio.sleep(idle)
        figures.server_cpu_without_s = cpu_seconds(apiserver_pid(cp)) - server_cpu
        await client.close()
    return figures


def table(rows: list[Figures], idle: float) -> str:
    lines = [
        f"| N | children: operator vs plain apply (ratio) | operator CPU idle ({idle:.0f} s) "
        "| RSS | operator API calls idle | writes idle | API server requests idle (our kinds) "
        "| API server CPU with vs without operator | one change at N |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in rows:
        calls = {k: v for k, v in f.calls.items() if k not in ("writes", "passes")}
        detail = ", ".join(f"{k} {v:.0f}" for k, v in calls.items())
        server = ", ".join(f"{k} {v:.0f}" for k, v in sorted(f.server_requests.items())) or "0"
        with_without = (
            f"{f.server_cpu_with_s:.1f} s vs {f.server_cpu_without_s:.1f} s "
            f"({f.server_cpu_with_s / max(f.server_cpu_without_s, 0.01):.2f}x)"
        )
        lines.append(
            f"| {f.n} | {f.operator_s:.1f} s vs {f.floor_s:.1f} s "
            f"({f.operator_s / f.floor_s:.2f}x) "
            f"| {f.idle_cpu_s:.1f} s ({100 * f.idle_cpu_s / idle:.2f}% of a core) "
            f"| {f.rss_mb:.0f} MB | {sum(calls.values()):.0f}{f' ({detail})' if detail else ''} "
            f"| {f.writes:.0f} | {server} | {with_without} | {f.change_s:.2f} s |"
        )
    passes = ", ".join(f"N={f.n}: {f.calls.get('passes', 0):.0f}" for f in rows)
    return "\n".join(lines) + f"\n\nreconcile passes during the idle window: {passes}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--idle", type=float, default=300.0, help="seconds of idle per window")
    parser.add_argument(
        "--resync", type=float, default=None, help="DSV4_RESYNC_SECONDS (default: the operator's)"
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        for n in (int(s) for s in args.sizes.split(",")):
            rows.append(asyncio.run(measure(n, args.idle, args.resync, Path(logs))))
            print(table(rows, args.idle), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
