"""A fleet of guarded DSV4Deployments whose guards all read answering engines: a few engine
doubles and leak taps on loopback addresses stand in for every deployment's pods.

kwok runs no container and gives pods made-up IPs, so a guard at scale would read nothing.
Here the engine pods of every deployment get the address of one engine double per role (the
double serves many deployments: it is started with the argv and env the operator renders for
that role, so the plan check passes), every router pod gets the address of a `dsv4 tap` (its
/metrics and /canary on the tap port, as the router pod's sidecar serves them), and every
deployment's canary reaches a decode double of its own address (the decode engine's argv):
through the tap, which runs it when the canary names no endpoint, or from the operator when it
names that double. `spread` > 1 runs that
many of each, deployments assigned by a hash of their name, so the doubles keep up at N=1,000;
`taps` (default `spread`) runs that many taps: each runs the canary of every deployment it
stands for, where a cluster has one per router pod, so a large fleet needs more of them than
of the doubles.

    with FleetEngines(rendered_docs, capabilities, log_dir, spread=2, taps=40) as engines:
        doc = guarded(example("ns", name="a"), engines.canary_endpoint("a"), "60s", "10s")
        await give_pods_addresses(http, "ns", engines, expected_pods=3 * n)

    baked = await until_baked(http, "ns", n, timeout=600)  # every revision last known good

This is what bench/scale.py and the scale test build their fleets from and watch them with.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import subprocess
import sys
import time
import zlib
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from dsv4_devcluster.controlplane import ControlPlane
from dsv4_devcluster.deployments import baked_revision
from dsv4_devcluster.kubelet import MANUAL_STATUS_ANNOTATION, MERGE_PATCH
from dsv4_devcluster.process import free_port, wait_for
from dsv4_engine_double.process import DoubleProcess, launch_from_statefulset
from dsv4_operator.api.limits import ENGINE_PORT, TAP_METRICS_PORT
from dsv4_operator.kube.resources import DSV4, Resource
from dsv4_operator.names import DEPLOYMENT_LABEL, ROLE_LABEL

ROLES = ("prefill", "decode", "router")
# Simulated time per chat request: no effect on verdicts, keeps canary runs short.
LATENCY_MS = "20"
# The last octet of each role's addresses, and of the canary's: 127.<a>.<b>.<octet + i>
# (at most 30 doubles of each; the router's taps from 100 on, at most 150).
OCTETS = {"prefill": 10, "decode": 40, "canary": 70, "router": 100}
MAX_SPREAD, MAX_TAPS = 30, 150


def replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    """`args` with `flag`'s value set to `value` (appended when absent)."""
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def guarded(
    doc: dict[str, Any],
    endpoint: str | None,
    interval: str,
    bake_time: str,
    confidence: float | None = None,
) -> dict[str, Any]:
    """`doc` (a DSV4Deployment) with its canary every `interval` at `endpoint` (None: the
    default, the router; a router pod's tap runs it), baking after `bake_time`, a Pass at
    leakRate `confidence` if given; every other guard setting (tap, engines, thresholds) is
    the default."""
    guard = doc["spec"].setdefault("guard", {})
    canary = guard.setdefault("canary", {})
    canary["interval"] = interval
    if endpoint is not None:
        canary["endpoint"] = endpoint
    guard["bakeTime"] = bake_time
    if confidence is not None:
        guard.setdefault("leakRate", {})["confidence"] = confidence
    return doc


class FleetEngines:
    """The doubles and taps behind a fleet's pods; see the module docstring."""

    def __init__(
        self,
        rendered: Iterable[Mapping[str, Any]],
        capabilities: Iterable[str],
        log_dir: Path,
        spread: int = 1,
        taps: int | None = None,
    ) -> None:
        """`rendered`: one deployment's children as `dsv4 render` gives them (every deployment
        of the fleet has the same spec but its name); `capabilities`: its engine's."""
        taps = spread if taps is None else taps
        if not (1 <= spread <= MAX_SPREAD and 1 <= taps <= MAX_TAPS):
            raise ValueError(
                f"spread {spread} and taps {taps}: at most {MAX_SPREAD} doubles per role and "
                f"{MAX_TAPS} taps, at least one of each"
            )
        capabilities = list(capabilities)
        statefulsets = {
            doc["metadata"]["labels"][ROLE_LABEL]: doc
            for doc in rendered
            if doc["kind"] == "StatefulSet"
        }
        self.engines = {
            role: launch_from_statefulset(sts, capabilities) for role, sts in statefulsets.items()
        }
        self.log_dir, self.spread = log_dir, spread
        base = f"127.{random.randrange(32, 250)}.{random.randrange(1, 250)}"
        self.ips = {
            role: [f"{base}.{octet + i}" for i in range(taps if role == "router" else spread)]
            for role, octet in OCTETS.items()
        }
        self.doubles: list[DoubleProcess] = []
        self.taps: list[subprocess.Popen[bytes]] = []

    def _pick(self, role: str, deployment: str) -> str:
        ips = self.ips[role]
        return ips[zlib.crc32(deployment.encode()) % len(ips)]

    def address(self, role: str, deployment: str) -> str:
        """The pod IP of `deployment`'s `role` pods."""
        return self._pick(role, deployment)

    def canary_endpoint(self, deployment: str) -> str:
        return f"http://{self._pick('canary', deployment)}:{ENGINE_PORT}"

    @property
    def allow(self) -> str:
        """The canary endpoints, for the operator's DSV4_CANARY_ENDPOINT_ALLOW."""
        return ",".join(f"http://{ip}:{ENGINE_PORT}" for ip in self.ips["canary"])

    def _double(self, role: str, ip: str) -> DoubleProcess:
        args, env = self.engines[role]
        args = replace_flag(replace_flag(args, "--host", ip), "--port", str(ENGINE_PORT))
        env = {**env, "DSV4_DOUBLE_LATENCY_MS": LATENCY_MS}
        return DoubleProcess(args, env, bind=False)

    def _tap(self, ip: str, upstream: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"tap-{ip}.log").open("wb")
        return subprocess.Popen(
            [
                sys.executable, "-m", "dsv4_operator.cli", "tap",
                "--upstream", upstream,
                "--listen", f"{ip}:{free_port()}",
                "--metrics", f"{ip}:{TAP_METRICS_PORT}",
                "--deployment", "fleet", "--namespace", "fleet",
                # One tap stands in for many deployments' router pods: each asks its runs.
                "--canary-runs-at-once", "64",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def start(self) -> FleetEngines:
        for i in range(self.spread):
            for role, ip in (
                ("prefill", self.ips["prefill"][i]),
                ("decode", self.ips["decode"][i]),
                ("decode", self.ips["canary"][i]),  # the canary talks to a decode engine
            ):
                self.doubles.append(self._double(role, ip).start(timeout=60))
        for i, ip in enumerate(self.ips["router"]):
            # The taps' router is a canary double, not the engine pods' decode double: that
            # one serves every deployment's engine reads, which would each count every other
            # deployment's canary requests (a deployment's own engines count its own).
            canaries = self.ips["canary"]
            upstream = f"http://{canaries[i % len(canaries)]}:{ENGINE_PORT}"
            self.taps.append(self._tap(ip, upstream))
        for ip in self.ips["router"]:
            wait_for(f"the tap's /metrics on {ip}", functools.partial(_serves, ip), timeout=60)
        return self

    def stop(self) -> None:
        for double in self.doubles:
            double.stop()
        for tap in self.taps:
            tap.terminate()
            try:
                tap.wait(10)
            except subprocess.TimeoutExpired:
                tap.kill()
                tap.wait()

    def __enter__(self) -> FleetEngines:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _serves(ip: str) -> bool:
    try:
        return httpx.get(f"http://{ip}:{TAP_METRICS_PORT}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def give_pods_addresses(
    http: httpx.AsyncClient,
    namespace: str,
    engines: FleetEngines,
    expected_pods: int,
    timeout: float = 600,
    in_flight: int = 8,
    interval: float = 1,
) -> None:
    """Until `expected_pods` pods of the fleet in `namespace` run at their role's address: each
    Running pod is taken off kwok's stages and given it (as `report_pod_ip` does, here for a
    whole fleet at once, with `http` a client of the API server)."""
    gate = asyncio.Semaphore(in_flight)
    key, value = MANUAL_STATUS_ANNOTATION
    headers = {"Content-Type": MERGE_PATCH}

    async def give(pod: Mapping[str, Any], ip: str) -> None:
        path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
        async with gate:
            annotate = {"metadata": {"annotations": {key: value}}}
            (await http.patch(path, json=annotate, headers=headers)).raise_for_status()
            status = {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
            (await http.patch(f"{path}/status", json=status, headers=headers)).raise_for_status()

    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        listed = await http.get(
            f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": DEPLOYMENT_LABEL}
        )
        listed.raise_for_status()
        done, todo = 0, []
        for pod in listed.json().get("items") or []:
            labels, status = pod["metadata"].get("labels") or {}, pod.get("status") or {}
            if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
                continue
            role = labels.get(ROLE_LABEL, "")
            if role not in ROLES:
                continue
            ip = engines.address(role, labels[DEPLOYMENT_LABEL])
            if status.get("podIP") == ip:
                done += 1
            else:
                todo.append(give(pod, ip))
        await asyncio.gather(*todo)
        if done + len(todo) >= expected_pods:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{done + len(todo)}/{expected_pods} pods at their addresses")
        await asyncio.sleep(interval)


# --- a fleet seen from the API server ----------------------------------------------------------

METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


async def watch_objects(
    http: httpx.AsyncClient, res: Resource, namespace: str, metadata: bool = True
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """(event type, object) of every `res` in `namespace`: ADDED for each listed, then what
    the watch sends. `metadata`: the objects' metadata only (cheaper at N = 1,000).

    A watch the API server ends or breaks is resumed from the last version seen, and listed
    again when that version has expired (410), so an object may come ADDED more than once:
    callers keep sets, not counts."""
    version: str | None = None
    while True:
        if version is None:
            listed = await http.get(
                res.path(namespace), headers={"Accept": METADATA_LIST} if metadata else {}
            )
            listed.raise_for_status()
            body = listed.json()
            for item in body.get("items") or []:
                yield "ADDED", item
            version = body["metadata"]["resourceVersion"]
        params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
        try:
            async with http.stream(
                "GET",
                res.path(namespace),
                params=params,
                headers={"Accept": METADATA_ONLY} if metadata else {},
                timeout=None,
            ) as stream:
                async for line in stream.aiter_lines():
                    event = json.loads(line)
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":  # 410 Gone: the version expired, list again
                        version = None
                        break
                    version = obj["metadata"].get("resourceVersion") or version
                    if kind != "BOOKMARK":
                        yield kind, obj
        except (httpx.ReadError, httpx.RemoteProtocolError):
            await asyncio.sleep(0.2)  # broken under load: resume from `version`


@dataclass
class ChildCounter:
    """Names of the objects of `kinds` seen in one namespace, fed by metadata-only watches."""

    http: httpx.AsyncClient
    namespace: str
    kinds: tuple[Resource, ...]
    seen: set[tuple[str, str]] = field(default_factory=set)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        for res in self.kinds:
            self.tasks.append(asyncio.create_task(self._watch(res)))

    async def _watch(self, res: Resource) -> None:
        async for kind, obj in watch_objects(self.http, res, self.namespace):
            if kind == "ADDED":
                self.seen.add((res.kind, obj["metadata"]["name"]))

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


async def observed(http: httpx.AsyncClient, namespace: str, n: int, timeout: float) -> list[float]:
    """time.monotonic() at which each of the `n` DSV4Deployments' status first observed its
    generation (from now on), in order: watched, so no poll interval blurs them."""
    stamps: dict[str, float] = {}

    async def follow() -> None:
        async for _, obj in watch_objects(http, DSV4, namespace, metadata=False):
            meta, status = obj["metadata"], obj.get("status") or {}
            if status.get("observedGeneration") == meta["generation"]:
                stamps.setdefault(meta["name"], time.monotonic())

    task = asyncio.create_task(follow())
    deadline = time.monotonic() + timeout
    try:
        while len(stamps) < n:
            if time.monotonic() > deadline or task.done():
                raise TimeoutError(f"{len(stamps)}/{n} deployments reconciled")
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return sorted(stamps.values())


# What the controllers and kwok write while a fleet comes up (not the nodes' heartbeats).
SETTLING = (
    *("pods", "statefulsets", "deployments", "replicasets", "services", "endpoints"),
    *("endpointslices", "poddisruptionbudgets", "controllerrevisions"),
)
READ_VERBS = ("GET", "LIST", "WATCH")


def request_counts(
    cp: ControlPlane,
    resources: Iterable[str],
    by_resource: bool = False,
    succeeded_only: bool = False,
) -> dict[str, float]:
    """Requests the API server answered on `resources`, by verb (`by_resource`: by
    "VERB resource"; `succeeded_only`: with a 2xx code)."""
    wanted, out = set(resources), dict[str, float]()
    for (verb, resource), value in cp.request_counts(succeeded_only).items():
        if resource in wanted:
            key = f"{verb} {resource}" if by_resource else verb
            out[key] = out.get(key, 0.0) + value
    return out


def quiet(cp: ControlPlane, seconds: float, timeout: float = 1800.0) -> float:
    """Until nobody (controllers, kwok, the fleet's address reports) has written the children's
    kinds for `seconds`; the time waited. The operator's own status writes are not waited on,
    nor refused writes: the endpoint controllers retry, for as long as the pods exist, the
    EndpointSlices the API server refuses for the doubles' loopback addresses (422), and a
    refused write changes nothing."""

    def writes() -> float:
        counts = request_counts(cp, SETTLING, succeeded_only=True)
        return sum(v for verb, v in counts.items() if verb not in READ_VERBS)

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


def baked(obj: Mapping[str, Any], engines_read: bool = True) -> bool:
    """`baked_revision` (deployments.py), its plan verified against what the engines report
    (when the guard reads them, `engines_read`): the steady state the fleet idles in (nothing
    left that a status would show changing)."""
    verified = not engines_read or any(
        c.get("type") == "PlanVerified" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )
    return baked_revision(obj) is not None and verified


async def until_baked(
    http: httpx.AsyncClient, namespace: str, n: int, timeout: float
) -> dict[str, Any]:
    """Until all `n` DSV4Deployments in `namespace` are `baked` and each has its Baked Event
    (posted after the status that says so); returns one of them."""
    deadline = time.monotonic() + timeout
    while True:
        listed = await http.get(DSV4.path(namespace))
        listed.raise_for_status()
        done = [
            d
            for d in listed.json().get("items") or []
            if baked(d, _engines_read(d.get("spec") or {}))
        ]
        if len(done) == n and await _baked_events(http, namespace) >= n:
            return dict(done[0])
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(done)}/{n} deployments baked")
        await asyncio.sleep(1)


def _engines_read(spec: Mapping[str, Any]) -> bool:
    """Whether the guard reads the engines (`spec.guard.engine.enabled`, on by default)."""
    guard = spec.get("guard") or {}
    return bool(guard.get("enabled", True) and (guard.get("engine") or {}).get("enabled", True))


async def _baked_events(http: httpx.AsyncClient, namespace: str) -> int:
    """How many DSV4Deployments in `namespace` have a Baked Event."""
    listed = await http.get(
        f"/api/v1/namespaces/{namespace}/events", params={"fieldSelector": "reason=Baked"}
    )
    listed.raise_for_status()
    return len({e["involvedObject"]["name"] for e in listed.json().get("items") or []})
