"""Benchmark: the operator at N = 10, 100, 1,000 guarded DSV4Deployments, every guard running.

For each N, on a fresh control plane with a scheduler and kwok (fake GPU nodes, so engine pods
become Running and Ready and every deployment reaches phase Ready), with engine doubles and
leak taps behind every pod (dsv4_devcluster.fleet: a few processes on loopback addresses serve
all deployments, so each guard's canary, engine and tap reads get real answers):

1. floor: a plain client server-side applies the manifests `dsv4 render` gives for N
   deployments (namespace `plain`, the operator's number of workers in flight) and times until
   all N x 9 children exist;
2. ideal controller: bench/ideal_controller.py watching namespace `ideal` (the plain apply's
   requests, from a controller, plus only what any controller must: the user's create, one
   status write); the same N guarded DSV4Deployments created at once; time until their
   children exist (what of the operator's time over the floor is any controller's);
3. operator: `dsv4 run` watching namespace `op`, its cache synced; N guarded DSV4Deployments
   created at once (canary every `--canary-interval`, bake after `--bake-time`); time until
   their N x 9 children exist, the ratio to the floor, the requests the operator made for
   them, and in each of the three windows the CPU of every process (the API server, the
   controllers, the operator or the ideal controller, this bench's own client);
4. every pod at its double's address, then every deployment baked (its revision last known
   good), then nobody writing the children's kinds for a few seconds;
5. idle with the operator (`--idle` seconds): its CPU, RSS, API requests by verb and resource
   (its own counters: what it wrote while nothing a user sees changed), canary runs (the
   guard's schedule), the API server's CPU and the requests it answered on our kinds; and,
   over this window and from creation to all baked, how long the guard's reads and canary runs
   waited for a slot and a read then held it (the operator's histograms);
6. idle without the operator (stopped; same objects, same doubles, same length): the API
   server's CPU; then the operator started again and, once settled, the same window with it
   again: the ratio is the mean of the two windows with over the one without, between them
   (the API server's own load drifts over a run, so one order alone biases it);
7. start-up: every deployment's spec changed while the operator is down (guard.errorLimit:
   no rollout), the operator started; time to the first and to the last status that observed
   the new generation.

Figures come from /proc (CPU = utime + stime, RSS = VmRSS), the operator's /metrics and the
API server's own `apiserver_request_total`. Children are counted from metadata-only watches.
The machine is shared: read ratios measured in the same run, not absolute times.

    python bench/scale.py [--n 10,100,1000] [--idle 120] [--canary-interval 60s] [--rounds 3]
                          [--idle-only] [--sources canary,tap,engine] [--profile DIR]

`--sources canary` leaves the tap and engine reads off: what the canary alone costs, the
floor under the operator's idle CPU with the default canary.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dsv4_devcluster import ControlPlane
from dsv4_devcluster.deployments import POOL, POOL_LABEL, RTX, example, weights_volume
from dsv4_devcluster.fleet import (
    ChildCounter,
    FleetEngines,
    give_pods_addresses,
    guarded,
    observed,
    quiet,
    request_counts,
    until_baked,
)
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.process import cpu_seconds
from dsv4_operator.api.status import parse_status
from dsv4_operator.api.times import Duration
from dsv4_operator.kube.client import KubeClient, http_client_for, load_configuration
from dsv4_operator.kube.resources import DEPLOYMENT, DSV4, PDB, SERVICE, STATEFULSET
from dsv4_operator.names import DEPLOYMENT_LABEL
from dsv4_operator.runtime.watched import WATCHED

REPO = Path(__file__).resolve().parents[1]

CHILDREN_PER_DEPLOYMENT = 9  # 2 StatefulSets + 3 Services + 1 Deployment + 3 PDBs
PODS_PER_DEPLOYMENT = 3  # prefill, decode, router: one replica each in the example
CHILD_KINDS = (STATEFULSET, DEPLOYMENT, SERVICE, PDB)
# Every kind the operator reads (its watch cache's list), and the Events it posts.
OPERATOR_RESOURCES = (*(w.resource.plural for w in WATCHED), "events")
IDEAL = "ideal"  # the namespace bench/ideal_controller.py watches
WORKERS = 4  # the operator's default (DSV4_WORKERS); the floor keeps as many applies in flight
DEPLOYMENTS_PER_NODE = 32  # 8 GPUs and 3 pods each: 96 of a node's 110 pods
# One tap per this many deployments: in a cluster each router pod's tap runs its own canary; 25
# deployments' runs a minute each is what a tap here keeps up with beside the rest at N=1,000.
DEPLOYMENTS_PER_TAP = 25
# The controller-manager's default 20 requests/s would take minutes to create the engine
# pods of 1,000 deployments; the figures are the operator's, not that queue's.
CONTROLLER_MANAGER = {"kube-api-qps": "500", "kube-api-burst": "1000"}
# Two router Services per deployment (plain and operator) need a ClusterIP each: more than the
# dev cluster's /24 holds at N = 1,000.
API_SERVER = {"service-cluster-ip-range": "10.0.0.0/16"}
OPERATOR_FLOOR = 10.0  # seconds: the operator's default minimum canary interval
# The guard's slots (operator metrics.py): how long reads and canary runs waited for one, and
# how long a read then held it; the bench reads their buckets over each window.
GUARD_SLOTS = {
    "reads waited": "dsv4_guard_read_slot_wait_seconds",
    "reads held": "dsv4_guard_read_seconds",
    "canary waited": "dsv4_canary_slot_wait_seconds",
}


# --- what a process costs ---------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_cpu(
    cp: ControlPlane,
    engines: FleetEngines,
    operator: OperatorProcess | None = None,
    controller: subprocess.Popen[bytes] | None = None,
) -> dict[str, float]:
    """CPU seconds so far of each control-plane process, the doubles and taps (summed), the
    operator's or the ideal controller's, and this bench's own (the plain apply's client)."""
    pids: dict[str, list[int]] = {}
    for p in cp.processes:
        pids.setdefault(p.name, []).append(p.pid)
    pids["doubles+taps"] = [d.process.pid for d in engines.doubles] + [t.pid for t in engines.taps]
    if operator is not None and operator.proc is not None:
        pids["operator"] = [operator.proc.pid]
    if controller is not None:
        pids["ideal controller"] = [controller.pid]
    cpu = {name: sum(map(cpu_seconds, group)) for name, group in pids.items()}
    own = resource.getrusage(resource.RUSAGE_SELF)
    cpu["bench (its client, watches)"] = own.ru_utime + own.ru_stime
    return cpu


def apiserver_pid(cp: ControlPlane) -> int:
    return cp.component("kube-apiserver").pid


def seconds(duration: str) -> float:
    """A spec duration ("60s", "2m") in seconds, parsed as the operator parses it."""
    return Duration(duration).delta.total_seconds()


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}


async def until_listed(operator: OperatorProcess, timeout: float = 60.0) -> None:
    """Until the operator has listed every kind it watches (its cache synced: no new LIST for a
    second), so the creation window does not time its start-up (measured on its own, step 7)."""
    deadline, last = time.monotonic() + timeout, -1.0
    while time.monotonic() < deadline:
        lists = operator_total(operator, "dsv4_watch_lists_total")
        if lists > 0 and lists == last:
            return
        last = lists
        await asyncio.sleep(1.0)
    raise TimeoutError(f"the operator did not list its kinds in {timeout:.0f}s")


def operator_samples(operator: OperatorProcess) -> list[Sample]:
    """Every sample on the operator's /metrics page (at N = 1,000 a page of megabytes, made
    in a thread beside the busy loop: seconds on a loaded machine, past httpx's default 5 s)."""
    with httpx.Client(timeout=60.0) as http:
        text = http.get(f"http://{operator.host}:{operator.metrics_port}/metrics").text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def operator_total(operator: OperatorProcess, name: str) -> float:
    """A counter of the operator's summed over its labels."""
    return sum(s.value for s in operator_samples(operator) if s.name == name)


def operator_counts(page: list[Sample]) -> dict[str, float]:
    """The operator's counters on a page of `operator_samples`: API requests by `kind verb
    resource`, passes, canary responses."""
    out: dict[str, float] = {}
    for s in page:
        if s.name in ("dsv4_api_writes_total", "dsv4_api_reads_total"):
            kind = "write" if "writes" in s.name else "read"
            key = f"{kind} {s.labels['verb']} {s.labels['resource']}"
        elif s.name in ("dsv4_reconciles_total", "dsv4_canary_responses_total"):
            key = s.name
        elif s.name == "dsv4_canary_runs_total":  # by who ran them: tap or operator
            key = f"{s.name} {s.labels['runner']}"
        else:
            continue
        out[key] = out.get(key, 0.0) + s.value
    return out


Slots = dict[str, dict[float, float]]  # by GUARD_SLOTS entry, cumulative count by bound


def operator_slots(page: list[Sample]) -> Slots:
    """The operator's slot histograms (GUARD_SLOTS) on a page of `operator_samples`, as
    exposed: cumulative counts by bound."""
    slots: Slots = {what: {} for what in GUARD_SLOTS}
    for s in page:
        for what, name in GUARD_SLOTS.items():
            if s.name == f"{name}_bucket":
                bound = float(s.labels["le"])
                slots[what][bound] = slots[what].get(bound, 0.0) + s.value
    return slots


def slots_between(after: Slots, before: Slots) -> Slots:
    """A window's observations, every bound kept (those with no new one too, as
    `histogram_quantile` needs them)."""
    return {
        what: {bound: count - before.get(what, {}).get(bound, 0.0) for bound, count in b.items()}
        for what, b in after.items()
    }


def quantile(q: float, buckets: dict[float, float]) -> float:
    """`histogram_quantile(q, ...)` over cumulative buckets, as Prometheus computes it: linear
    within the bucket the rank falls in, the highest finite bound when it falls in +Inf; NaN
    with no observation."""
    bounds = sorted(buckets)
    total = buckets.get(float("inf"), 0.0)
    if total <= 0 or len(bounds) < 2:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def slots_line(buckets: dict[float, float]) -> str:
    """One slot histogram's figures over a window: p50 / p90 / p99 as `histogram_quantile`
    gives them (interpolated within a bucket, so the share within the first bucket says how
    much of that is the buckets' resolution), the share over 1 s (the DSV4GuardReadsQueued
    rule's line is the read waits' p90 over 1 s), and how many were observed."""
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return "none"
    p50, p90, p99 = (quantile(q, buckets) for q in (0.5, 0.9, 0.99))
    first = min(buckets)
    within = buckets[first] / total
    over = 1 - buckets.get(1.0, 0.0) / total
    return (
        f"p50 {p50:.3g} s, p90 {p90:.3g} s, p99 {p99:.3g} s; {100 * within:.1f}% within "
        f"{first:g} s, {100 * over:.1f}% over 1 s; n = {total:,.0f}"
    )


# --- one size -----------------------------------------------------------------------------------


@dataclass
class Plan:
    """What to run for one N; the defaults are the issue's (docs: module docstring)."""

    n: int
    idle: float = 120.0
    canary_interval: str = "60s"
    bake_time: str = "10s"
    # leakRate.confidence: how many canary responses a Pass takes (0.6: one run's), so the
    # fleet bakes within a canary interval or two; a run's cost does not depend on it.
    confidence: float = 0.6
    resync: float | None = None  # DSV4_RESYNC_SECONDS; None: the operator's default
    idle_reads: float | None = None  # DSV4_GUARD_IDLE_READ_SECONDS; None: the default
    quiet_seconds: float = 10.0
    spread: int = 1  # engine doubles per role (and canaries)
    # Taps: each runs the canary of every deployment it stands for (a cluster has one per
    # router pod), so a large fleet needs more taps than doubles.
    taps: int = 1
    without: bool = True  # the idle window without the operator
    startup: bool = True  # the restart with N deployments
    profile: Path | None = None  # py-spy's folded stacks of the idle operator go here
    # The guard's sources left on; the others get `enabled: false` (what each one costs).
    sources: tuple[str, ...] = ("canary", "tap", "engine")
    # Who runs the canary: "tap" (the default spec: the router pods' taps, asked by the
    # operator) or "operator" (canary.endpoint set: the operator runs every request).
    canary_on: str = "tap"
    # Creation rounds (plain apply, ideal controller, operator): the ratios are read as the
    # median of these, since one round's vary by 0.3x on a shared machine.
    rounds: int = 1


@dataclass
class Round:
    """One creation round: seconds until the children exist, for each of the three."""

    floor_s: float
    ideal_s: float
    operator_s: float

    def __str__(self) -> str:
        return (
            f"plain apply {self.floor_s:.1f} s, ideal controller {self.ideal_s:.1f} s, "
            f"operator {self.operator_s:.1f} s"
        )


@dataclass
class Figures:
    n: int
    floor_s: float = 0.0
    operator_s: float = 0.0
    creation: dict[str, float] = field(default_factory=dict)
    creation_passes: float = 0.0
    rounds: list[Round] = field(default_factory=list)  # --rounds, the main one last
    # CPU seconds each process used while the children were made: the floor's window and the
    # operator's (whose extra work beside the 9 applies the time ratio is made of).
    floor_cpu: dict[str, float] = field(default_factory=dict)
    # bench/ideal_controller.py: the plain apply's requests plus only what any controller must.
    ideal_s: float = 0.0
    ideal_cpu: dict[str, float] = field(default_factory=dict)
    operator_cpu: dict[str, float] = field(default_factory=dict)
    baked_s: float = 0.0
    idle_cpu_s: float = 0.0
    # The engine doubles' and taps' CPU over the same window: they answer the same canary
    # requests and reads whatever the operator's code, so operator / doubles is a figure that
    # holds across runs on a machine whose speed varies (a shared VM).
    fleet_cpu_s: float = 0.0
    taps_cpu_s: float = 0.0  # of fleet_cpu_s, the taps' (they run the canary by default)
    rss_mb: float = 0.0
    idle_calls: dict[str, float] = field(default_factory=dict)
    canary_runs: float = 0.0
    canary_runs_due: float = 0.0
    server_requests: dict[str, float] = field(default_factory=dict)
    server_cpu_with_s: float = 0.0
    server_cpu_without_s: float = 0.0
    # The same window again with the operator, after the one without: the API server's load
    # drifts (the controller-manager's retries back off), so "without" is set between two.
    server_cpu_with_again_s: float = 0.0
    first_reconciled_s: float = 0.0
    all_reconciled_s: float = 0.0
    # The guard's slots by window: "bring-up" (creation to all baked) and "idle".
    slots: dict[str, Slots] = field(default_factory=dict)

    def calls(self, kind: str) -> dict[str, float]:
        """The operator's API requests of `kind` ("write" or "read") while idle."""
        return {k.split(" ", 1)[1]: v for k, v in self.idle_calls.items() if k.startswith(kind)}


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
    counter = ChildCounter(http, namespace, CHILD_KINDS)
    await counter.start()
    start = time.monotonic()
    await create()
    await counter.until(n * CHILDREN_PER_DEPLOYMENT, timeout=60 + n * 2)
    elapsed = time.monotonic() - start
    await counter.stop()
    return elapsed


STARTED = time.monotonic()


def say(n: int, what: str) -> None:
    """A progress line, stamped with the seconds since the bench started."""
    print(f"[{time.monotonic() - STARTED:6.0f}s] N={n}: {what}", flush=True)


async def measure(plan: Plan, logs: Path) -> Figures:
    n, figures = plan.n, Figures(plan.n)
    say(n, f"{plan.spread} engine double(s) per role, {plan.taps} tap(s)")
    crd = REPO / "crds" / "dsv4.io_dsv4deployments.yaml"
    with ControlPlane(
        with_scheduler=True,
        with_kwok=True,
        crds=[crd],
        extra_apiserver_args=API_SERVER,
        extra_controller_manager_args=CONTROLLER_MANAGER,
    ) as cp:
        # The floor's, the ideal controller's and the operator's pods, in each round.
        for i in range(-(-3 * n * plan.rounds // DEPLOYMENTS_PER_NODE)):
            cp.add_gpu_node(
                f"fleet-{i}", gpus=8 * DEPLOYMENTS_PER_NODE, product=RTX, labels={POOL_LABEL: POOL}
            )
        cfg = load_configuration(str(cp.kubeconfig_path))
        client = KubeClient(http_client_for(cfg, timeout=120), field_manager="bench")
        dyn = cp.dynamic_client()
        earlier = [f"{ns}-{r}" for r in range(1, plan.rounds) for ns in ("plain", IDEAL, "op")]
        for ns in (*earlier, "plain", IDEAL, "op"):
            dyn.resources.get(api_version="v1", kind="Namespace").create(
                body={"metadata": {"name": ns}}
            )
            weights_volume(dyn, ns)
        one = example("op")
        with FleetEngines(
            rendered("op", 1),
            one["spec"]["engine"]["capabilities"],
            logs,
            plan.spread,
            plan.taps,
        ) as engines:
            try:
                await run_fleet(plan, figures, cp, client, engines, logs)
            finally:
                await client.close()
    return figures


def guarded_docs(plan: Plan, engines: FleetEngines, namespace: str) -> list[dict[str, Any]]:
    """The N guarded DSV4Deployments the operator (or the ideal controller) is given."""
    return [
        with_sources(
            guarded(
                d,
                engines.canary_endpoint(d["metadata"]["name"])
                if plan.canary_on == "operator"
                else None,
                plan.canary_interval,
                plan.bake_time,
                plan.confidence,
            ),
            plan.sources,
        )
        for d in deployments(namespace, plan.n)
    ]


async def ideal_round(
    plan: Plan,
    cp: ControlPlane,
    client: KubeClient,
    engines: FleetEngines,
    logs: Path,
    namespace: str = IDEAL,
) -> tuple[float, dict[str, float]]:
    """The same creates, taken up by bench/ideal_controller.py in `namespace`: the time until
    the children exist and the CPU each process used meanwhile."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for child in rendered(namespace, plan.n):
        by_name.setdefault(child["metadata"]["labels"][DEPLOYMENT_LABEL], []).append(child)
    children = logs / f"{namespace}-children.json"
    children.write_text(json.dumps(by_name))
    with (logs / f"{namespace}-controller.log").open("wb") as log:
        controller = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "bench" / "ideal_controller.py"),
                str(cp.kubeconfig_path),
                namespace,
                str(children),
                "--workers",
                str(WORKERS),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    # Its pods get the doubles' addresses too: the operator's window has that load (its
    # guard reads them), so this one must.
    addresses = asyncio.create_task(with_addresses(plan, client, engines, namespace))
    try:
        docs = guarded_docs(plan, engines, namespace)
        await asyncio.sleep(2)  # its watch is open (the creates are not listed, but watched)
        cpu = process_cpu(cp, engines, controller=controller)
        elapsed = await timed_children(
            client.http, namespace, plan.n, lambda: bounded(16, (client.apply(d) for d in docs))
        )
        return elapsed, delta(process_cpu(cp, engines, controller=controller), cpu)
    finally:
        addresses.cancel()
        controller.terminate()
        controller.wait(30)


async def with_addresses(
    plan: Plan, client: KubeClient, engines: FleetEngines, namespace: str
) -> None:
    await give_pods_addresses(
        client.http,
        namespace,
        engines,
        plan.n * PODS_PER_DEPLOYMENT,
        timeout=600 + 2 * plan.n,
        interval=2,
    )


async def floor_round(
    plan: Plan, cp: ControlPlane, client: KubeClient, engines: FleetEngines, namespace: str
) -> tuple[float, dict[str, float]]:
    """The plain apply of the rendered children in `namespace`: time and CPU."""
    manifests = rendered(namespace, plan.n)
    cpu = process_cpu(cp, engines)
    elapsed = await timed_children(
        client.http,
        namespace,
        plan.n,
        lambda: bounded(WORKERS, (client.apply(m) for m in manifests)),
    )
    return elapsed, delta(process_cpu(cp, engines), cpu)


def operator_process(
    plan: Plan, cp: ControlPlane, engines: FleetEngines, logs: Path, namespace: str
) -> OperatorProcess:
    env = {"DSV4_CANARY_ENDPOINT_ALLOW": engines.allow}
    if seconds(plan.canary_interval) < OPERATOR_FLOOR:
        env["DSV4_MIN_CANARY_INTERVAL"] = plan.canary_interval
    if plan.idle_reads is not None:
        env["DSV4_GUARD_IDLE_READ_SECONDS"] = str(plan.idle_reads)
    operator = OperatorProcess(cp.kubeconfig_path, namespace, logs, wrap=None, **env)
    if plan.resync is None:
        del operator.env["DSV4_RESYNC_SECONDS"]  # the operator's own default
    else:
        operator.env["DSV4_RESYNC_SECONDS"] = str(plan.resync)
    return operator


async def earlier_round(
    number: int, plan: Plan, cp: ControlPlane, client: KubeClient, engines: FleetEngines, logs: Path
) -> Round:
    """One more creation round before the main one (--rounds): the plain apply, the ideal
    controller and an operator of its own, each in a namespace of its own."""
    plain, ideal, op = (f"{ns}-{number}" for ns in ("plain", IDEAL, "op"))
    floor_s, _ = await floor_round(plan, cp, client, engines, plain)
    await asyncio.to_thread(quiet, cp, plan.quiet_seconds)
    ideal_s, _ = await ideal_round(plan, cp, client, engines, logs, ideal)
    await asyncio.to_thread(quiet, cp, plan.quiet_seconds)
    operator = operator_process(plan, cp, engines, logs, op)
    operator.start()
    addresses = asyncio.create_task(with_addresses(plan, client, engines, op))
    try:
        docs = guarded_docs(plan, engines, op)
        await until_listed(operator)
        operator_s = await timed_children(
            client.http, op, plan.n, lambda: bounded(16, (client.apply(d) for d in docs))
        )
    finally:
        addresses.cancel()
        operator.stop()
    say(plan.n, f"round {number}: {Round(floor_s, ideal_s, operator_s)}")
    await asyncio.to_thread(quiet, cp, plan.quiet_seconds)
    return Round(floor_s, ideal_s, operator_s)


async def run_fleet(
    plan: Plan,
    figures: Figures,
    cp: ControlPlane,
    client: KubeClient,
    engines: FleetEngines,
    logs: Path,
) -> None:
    n, http = plan.n, client.http
    for number in range(1, plan.rounds):
        figures.rounds.append(await earlier_round(number, plan, cp, client, engines, logs))
    figures.floor_s, figures.floor_cpu = await floor_round(plan, cp, client, engines, "plain")
    say(n, f"floor {figures.floor_s:.1f}s")
    await asyncio.to_thread(quiet, cp, plan.quiet_seconds)  # the floor's pods are all Running
    figures.ideal_s, figures.ideal_cpu = await ideal_round(plan, cp, client, engines, logs)
    say(n, f"ideal controller {figures.ideal_s:.1f}s")
    await asyncio.to_thread(quiet, cp, plan.quiet_seconds)

    operator = operator_process(plan, cp, engines, logs, "op")
    operator.start()
    try:
        docs = guarded_docs(plan, engines, "op")
        await until_listed(operator)  # running before the creates, as a user's operator is
        page = operator_samples(operator)  # one read of the page for both (megabytes at 1,000)
        before, waited = operator_counts(page), operator_slots(page)
        start = time.monotonic()
        # Pods get their engines' addresses as they start, as on a cluster: a guard reading
        # kwok's made-up IPs meanwhile would time out and slow the creation it measures.
        addresses = asyncio.create_task(with_addresses(plan, client, engines, "op"))
        try:
            assert operator.proc is not None
            spy = profiler(plan, operator.proc.pid, "creation")
            cpu = process_cpu(cp, engines, operator)
            figures.operator_s = await timed_children(
                http, "op", n, lambda: bounded(16, (client.apply(d) for d in docs))
            )
            figures.operator_cpu = delta(process_cpu(cp, engines, operator), cpu)
            stop_profiler(spy)
            counts = delta(operator_counts(operator_samples(operator)), before)
            figures.creation = {k: v for k, v in counts.items() if " " in k}
            figures.creation_passes = counts.get("dsv4_reconciles_total", 0.0)
            figures.rounds.append(Round(figures.floor_s, figures.ideal_s, figures.operator_s))
            say(
                n,
                f"operator {figures.operator_s:.1f}s; {figures.creation_passes:.0f} passes; "
                f"{figures.creation}",
            )
            await addresses
        finally:
            addresses.cancel()
        say(n, f"every pod at its engine's address {time.monotonic() - start:.1f}s after creation")
        baked = await until_baked(http, "op", n, timeout=600 + 2 * n)
        figures.baked_s = time.monotonic() - start
        figures.slots["bring-up"] = slots_between(
            operator_slots(operator_samples(operator)), waited
        )
        say(n, f"all baked {figures.baked_s:.1f}s after creation")
        await asyncio.to_thread(quiet, cp, plan.quiet_seconds)
        await idle_with(plan, figures, cp, operator, baked, engines, http)
    finally:
        operator.stop()
    if plan.without:
        server_cpu = cpu_seconds(apiserver_pid(cp))
        await asyncio.sleep(plan.idle)
        figures.server_cpu_without_s = cpu_seconds(apiserver_pid(cp)) - server_cpu
        await asyncio.to_thread(operator.start)
        try:
            await until_baked(http, "op", n, timeout=600 + 2 * n)  # the start-up settled
            await asyncio.to_thread(quiet, cp, plan.quiet_seconds)
            server_cpu = cpu_seconds(apiserver_pid(cp))
            await asyncio.sleep(plan.idle)
            figures.server_cpu_with_again_s = cpu_seconds(apiserver_pid(cp)) - server_cpu
        finally:
            operator.stop()
        say(
            n,
            f"API server CPU with {figures.server_cpu_with_s:.1f} s, without "
            f"{figures.server_cpu_without_s:.1f} s, "
            f"with again {figures.server_cpu_with_again_s:.1f} s",
        )
    if plan.startup:
        await restart(plan, figures, client, operator, docs)


def profiler(plan: Plan, pid: int, window: str) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the operator until stopped (folded stacks, one file per N and
    window), or None without --profile. --nonblocking: the operator is not paused to be
    sampled."""
    if plan.profile is None:
        return None
    out = plan.profile / f"operator-{window}-n{plan.n}.folded"
    command = [
        "py-spy", "record", "--pid", str(pid), "--rate", "50", "--nonblocking",
        "--format", "raw", "--output", str(out),
    ]  # fmt: skip
    say(plan.n, f"profiling the operator's {window} into {out}")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(spy: subprocess.Popen[bytes] | None) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        spy.wait(60)


async def idle_with(
    plan: Plan,
    figures: Figures,
    cp: ControlPlane,
    operator: OperatorProcess,
    one: dict[str, Any],
    engines: FleetEngines,
    http: httpx.AsyncClient,
) -> None:
    """The idle window with the operator: its cost, and what it and the API server did."""
    assert operator.proc is not None
    statuses = await status_by_name(http, "op")
    pid, server = operator.proc.pid, apiserver_pid(cp)
    page = operator_samples(operator)
    ops, waited = operator_counts(page), operator_slots(page)
    srv = request_counts(cp, OPERATOR_RESOURCES, by_resource=True)
    cpu, server_cpu = cpu_seconds(pid), cpu_seconds(server)
    doubles, taps = [d.process.pid for d in engines.doubles], [t.pid for t in engines.taps]
    doubles_cpu, taps_cpu = sum(map(cpu_seconds, doubles)), sum(map(cpu_seconds, taps))
    spy = profiler(plan, pid, "idle")
    await asyncio.sleep(plan.idle)
    stop_profiler(spy)
    figures.idle_cpu_s = cpu_seconds(pid) - cpu
    figures.taps_cpu_s = sum(map(cpu_seconds, taps)) - taps_cpu
    figures.fleet_cpu_s = sum(map(cpu_seconds, doubles)) - doubles_cpu + figures.taps_cpu_s
    figures.server_cpu_with_s = cpu_seconds(server) - server_cpu
    figures.rss_mb = rss_mb(pid)
    page = operator_samples(operator)
    figures.idle_calls = delta(operator_counts(page), ops)
    figures.slots["idle"] = slots_between(operator_slots(page), waited)
    figures.server_requests = delta(request_counts(cp, OPERATOR_RESOURCES, by_resource=True), srv)
    canary = one["spec"]["guard"]["canary"]
    per_run = one["status"]["guard"]["canarySessions"] * canary.get("rounds", 4)
    figures.canary_runs = figures.idle_calls.get("dsv4_canary_responses_total", 0) / per_run
    figures.canary_runs_due = plan.n * plan.idle / seconds(plan.canary_interval)
    say(plan.n, f"idle {figures.idle_calls}; API server {figures.server_requests}")
    for name, change in status_changes(statuses, await status_by_name(http, "op")):
        say(plan.n, f"status written while idle: {name}: {change}")


async def status_by_name(http: httpx.AsyncClient, namespace: str) -> dict[str, dict[str, Any]]:
    listed = await http.get(DSV4.path(namespace))
    listed.raise_for_status()
    items = listed.json().get("items") or []
    return {d["metadata"]["name"]: d.get("status") or {} for d in items}


def status_changes(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> list[tuple[str, str]]:
    """What a user sees changed in each status between two lists (the operator's own
    `visible_wire`: status.guard's live counts left out): the fields by name, a condition by
    type (its status and reason), `guard` by field; so an idle write says why it was made."""

    def fields(raw: dict[str, Any]) -> dict[str, Any]:
        status = parse_status(raw).visible_wire()
        out = {k: v for k, v in status.items() if k not in ("conditions", "guard")}
        guard, conditions = status.get("guard"), status.get("conditions")
        out |= {f"guard.{k}": v for k, v in (guard if isinstance(guard, dict) else {}).items()}
        for c in conditions if isinstance(conditions, list) else []:
            out[f"condition {c.get('type')}"] = f"{c.get('status')} {c.get('reason')}"
        return out

    changes = []
    for name in sorted(set(before) | set(after)):
        was, now = fields(before.get(name, {})), fields(after.get(name, {}))
        moved = [f"{k} {was.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(was) | set(now))
                 if was.get(k) != now.get(k)]  # fmt: skip
        if moved:
            changes.append((name, "; ".join(moved)))
    return changes


async def restart(
    plan: Plan,
    figures: Figures,
    client: KubeClient,
    operator: OperatorProcess,
    docs: list[dict[str, Any]],
) -> None:
    """Every spec changed while the operator is down; the time from its start to the first and
    the last status that observed the change."""
    for doc in docs:
        doc["spec"]["guard"]["errorLimit"] = 5  # a new generation, no new revision
    await bounded(16, (client.apply(d) for d in docs))
    start = time.monotonic()
    waiting = asyncio.create_task(observed(client.http, "op", plan.n, timeout=600 + plan.n))
    await asyncio.sleep(0)  # the watch lists before the operator can write
    await asyncio.to_thread(operator.start)
    try:
        stamps = await waiting
    finally:
        operator.stop()
    figures.first_reconciled_s, figures.all_reconciled_s = stamps[0] - start, stamps[-1] - start
    say(
        plan.n,
        f"restart: first {figures.first_reconciled_s:.1f}s, all {figures.all_reconciled_s:.1f}s",
    )


def with_sources(doc: dict[str, Any], sources: tuple[str, ...]) -> dict[str, Any]:
    """`doc` with the guard's tap and engine reads switched off unless named in `sources`."""
    guard = doc["spec"]["guard"]
    for source in ("tap", "engine"):
        if source not in sources:
            guard.setdefault(source, {})["enabled"] = False
    return doc


def by_verb(calls: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in sorted(calls.items())) or "0"


def total(calls: dict[str, float]) -> str:
    return f"{sum(calls.values()):.0f} ({by_verb(calls)})" if calls else "0"


def table(rows: list[Figures], plan: Plan) -> str:
    lines = [
        f"idle window {plan.idle:.0f} s, canary every {plan.canary_interval}, bake "
        f"{plan.bake_time}; guard sources {', '.join(plan.sources)}; canary run by the "
        f"{'taps' if plan.canary_on == 'tap' else 'operator'}; idle-read bound: "
        f"{f'{plan.idle_reads:g} s' if plan.idle_reads else 'the operator default'}; CPU in % "
        "of one core over the window",
        "",
        "| N | operator CPU idle (vs the doubles') | taps' CPU idle | RSS "
        "| writes idle (verb resource) "
        "| reads idle | canary runs idle (due) | API server requests idle (our kinds) "
        "| API server CPU with, with again vs without (mean of the two with) "
        "| children: operator vs plain apply | start-up: first / all reconciled |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in rows:
        with_mean = (f.server_cpu_with_s + f.server_cpu_with_again_s) / 2
        server = (
            f"{f.server_cpu_with_s:.1f} s, {f.server_cpu_with_again_s:.1f} s vs "
            f"{f.server_cpu_without_s:.1f} s ({with_mean / f.server_cpu_without_s:.2f}x)"
            if plan.without and f.server_cpu_without_s > 0
            else f"{f.server_cpu_with_s:.1f} s vs - (not measured)"
        )
        startup = (
            f"{f.first_reconciled_s:.1f} s / {f.all_reconciled_s:.1f} s" if plan.startup else "-"
        )
        lines.append(
            f"| {f.n} | {100 * f.idle_cpu_s / plan.idle:.1f}% "
            f"({f.idle_cpu_s / max(f.fleet_cpu_s, 0.01):.2f}x) "
            f"| {100 * f.taps_cpu_s / plan.idle:.1f}% | {f.rss_mb:.0f} MiB "
            f"| {total(f.calls('write'))} | {total(f.calls('read'))} "
            f"| {f.canary_runs:.0f} ({f.canary_runs_due:.0f}) | {by_verb(f.server_requests)} "
            f"| {server} "
            f"| {children(f)} "
            f"| {startup} |"
        )
    creation = "\n".join(
        f"  N={f.n}: {sum(f.creation.values()) / f.n:.1f} per deployment against the plain "
        f"apply's {CHILDREN_PER_DEPLOYMENT} ({by_verb(f.creation)})"
        for f in rows
    )
    cpu = "\n".join(
        f"  N={f.n}: plain apply {cpu_line(f.floor_cpu)}\n"
        f"  N={f.n}: ideal controller {cpu_line(f.ideal_cpu)}\n"
        f"  N={f.n}: operator {cpu_line(f.operator_cpu)}"
        for f in rows
    )
    slots = "\n".join(
        f"  N={f.n} {window}: {what} {slots_line(buckets)}"
        for f in rows
        for window, by_what in f.slots.items()
        for what, buckets in by_what.items()
    )
    return (
        "\n".join(lines)
        + f"\n\nthe operator's API requests while creating:\n{creation}"
        + f"\n\nCPU seconds while the children were made:\n{cpu}"
        + "\n\nthe guard's slots (reads: DSV4_GUARD_READS_AT_ONCE, waited for and then held "
        + "by the read; canary runs: DSV4_GUARD_CANARIES_AT_ONCE), from creation to all baked "
        + f"and idle:\n{slots}"
    )


def children(f: Figures) -> str:
    """The creation figures: the main round's times, then the median ratios over the rounds."""
    main = (
        f"{f.operator_s:.1f} s vs {f.floor_s:.1f} s ({f.operator_s / f.floor_s:.2f}x; "
        f"ideal controller {f.ideal_s:.1f} s, {f.ideal_s / f.floor_s:.2f}x)"
    )
    if len(f.rounds) < 2:
        return main
    over_floor = [r.operator_s / r.floor_s for r in f.rounds]
    ideal_over_floor = [r.ideal_s / r.floor_s for r in f.rounds]
    over_ideal = [r.operator_s / r.ideal_s for r in f.rounds]
    return (
        f"{main}; median of {len(f.rounds)} rounds: operator {spread(over_floor)} and ideal "
        f"controller {spread(ideal_over_floor)} of the plain apply, operator "
        f"{spread(over_ideal)} of the ideal controller"
    )


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def cpu_line(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {s:.1f}" for name, s in sorted(cpu.items(), key=lambda kv: -kv[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", "--sizes", dest="n", default="10,100,1000")
    parser.add_argument("--idle", type=float, default=120.0, help="seconds per idle window")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="creation rounds (plain apply, ideal controller, operator); the children ratios "
        "are then the median over them",
    )
    parser.add_argument("--canary-interval", default="60s", help="spec.guard.canary.interval")
    parser.add_argument("--bake-time", default="10s", help="spec.guard.bakeTime")
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.6,
        help="spec.guard.leakRate.confidence (how soon the fleet bakes)",
    )
    parser.add_argument(
        "--resync", type=float, default=None, help="DSV4_RESYNC_SECONDS (default: the operator's)"
    )
    parser.add_argument(
        "--idle-read-seconds",
        type=float,
        default=None,
        help="DSV4_GUARD_IDLE_READ_SECONDS: the longest wait between reads of an idle tap or "
        "engine (default: the operator's)",
    )
    parser.add_argument(
        "--spread", type=int, default=0, help="doubles per role (default: one per 250 deployments)"
    )
    parser.add_argument(
        "--taps",
        type=int,
        default=0,
        help=f"router taps (default: one per {DEPLOYMENTS_PER_TAP} deployments; each runs the "
        "canary of the deployments it stands for)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="a folder: py-spy (pip install py-spy) samples the idle operator into it",
    )
    parser.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="a folder kept after the run for the operator's, the doubles' and the taps' logs "
        "(default: a temporary one)",
    )
    parser.add_argument(
        "--idle-only",
        action="store_true",
        help="skip the idle window without the operator and the start-up (A/B of idle cost)",
    )
    parser.add_argument(
        "--sources",
        default="canary,tap,engine",
        help="the guard's sources left on (canary always: the fleet bakes on it); "
        "e.g. --sources canary for the canary's cost alone",
    )
    parser.add_argument(
        "--canary-on",
        choices=("tap", "operator"),
        default="tap",
        help="who runs the canary: the router pods' taps (the default spec) or the operator "
        "(canary.endpoint set)",
    )
    args = parser.parse_args()
    sources = tuple(s.strip() for s in args.sources.split(",") if s.strip())
    if "canary" not in sources or not set(sources) <= {"canary", "tap", "engine"}:
        parser.error("--sources: canary, and any of tap and engine (comma-separated)")
    if args.canary_on == "tap" and "tap" not in sources:
        parser.error("--canary-on tap needs the tap on (--sources canary,tap,...)")
    if args.profile is not None:
        if shutil.which("py-spy") is None:
            parser.error("--profile needs py-spy on PATH: pip install py-spy")
        args.profile.mkdir(parents=True, exist_ok=True)
    rows: list[Figures] = []
    plan = Plan(0)
    with contextlib.ExitStack() as stack:
        logs = args.logs or stack.enter_context(tempfile.TemporaryDirectory())
        for n in (int(s) for s in args.n.split(",")):
            plan = Plan(
                n,
                idle=args.idle,
                canary_interval=args.canary_interval,
                bake_time=args.bake_time,
                confidence=args.confidence,
                resync=args.resync,
                idle_reads=args.idle_read_seconds,
                spread=args.spread or max(1, n // 250),
                taps=args.taps or max(1, n // DEPLOYMENTS_PER_TAP),
                profile=args.profile,
                without=not args.idle_only,
                startup=not args.idle_only,
                sources=sources,
                canary_on=args.canary_on,
                rounds=args.rounds,
            )
            started = time.monotonic()
            here = Path(logs) / f"n{n}"  # each N's logs apart
            here.mkdir(parents=True, exist_ok=True)
            rows.append(asyncio.run(measure(plan, here)))
            say(n, f"measured in {time.monotonic() - started:.0f}s")
            print(table(rows, plan), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
