"""Services for the playground's pods, as kube-proxy's userspace mode did it: inside each pod's
network namespace, every Service's ClusterIP is an address of the namespace's own ``lo`` and a
relay accepts on ``ClusterIP:port`` and connects to a ready endpoint (``podIP:targetPort``,
from the Service's EndpointSlices), round-robin. Names resolve through the pod's /etc/hosts
(``<service>.<ns>.svc``). Nothing is added to the host's interfaces; it all goes with the
namespace.
"""

from __future__ import annotations

import contextlib
import itertools
import selectors
import socket
import subprocess
import threading
from dataclasses import dataclass
from functools import partial
from typing import Any

from dsv4_devcluster.netns import Pod, in_namespace, pump


@dataclass(frozen=True)
class ServicePort:
    """One port of one Service with a ClusterIP: where it listens, its ready endpoints."""

    name: str  # <service>.<namespace>
    cluster_ip: str
    port: int
    endpoints: tuple[tuple[str, int], ...]


def service_ports(dyn: Any) -> list[ServicePort]:
    """Every port of every Service that has a ClusterIP, with its ready endpoints."""
    services = dyn.resources.get(api_version="v1", kind="Service").get().to_dict()["items"]
    slices = dyn.resources.get(api_version="discovery.k8s.io/v1", kind="EndpointSlice")
    by_service: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in slices.get().to_dict()["items"]:
        owner = (item["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
        if owner:
            by_service.setdefault((item["metadata"]["namespace"], owner), []).append(item)
    found = []
    for service in services:
        meta, spec = service["metadata"], service["spec"]
        cluster_ip = spec.get("clusterIP")
        if not cluster_ip or cluster_ip == "None" or spec.get("type") == "ExternalName":
            continue
        endpoint_slices = by_service.get((meta["namespace"], meta["name"]), [])
        for port in spec.get("ports") or []:
            targets = tuple(
                (address, slice_port["port"])
                for item in endpoint_slices
                for slice_port in item.get("ports") or []
                if slice_port.get("name", "") == port.get("name", "")
                for endpoint in item.get("endpoints") or []
                if (endpoint.get("conditions") or {}).get("ready")
                for address in endpoint["addresses"]
            )
            found.append(
                ServicePort(
                    f"{meta['name']}.{meta['namespace']}", cluster_ip, port["port"], targets
                )
            )
    return found


def host_lines(ports: list[ServicePort]) -> list[str]:
    """/etc/hosts lines: each Service's names at its ClusterIP."""
    names = {p.cluster_ip: p.name for p in ports}
    return [f"{ip}\t{name}.svc {name}.svc.cluster.local" for ip, name in sorted(names.items())]


class ServiceRelay:
    """The Services of one pod's namespace: one thread, a listener per ClusterIP:port.

    A port the pod's own containers declare is left out: a relay there would take the port
    from the container, which binds it on every address (kube-proxy's DNAT has no such limit,
    so a pod cannot reach another Service on a port number it serves itself here)."""

    def __init__(self, pod: Pod, own_ports: frozenset[int] = frozenset()) -> None:
        self.pod, self.own_ports = pod, own_ports
        self._selector = selectors.DefaultSelector()
        self._listening: dict[tuple[str, int], socket.socket] = {}
        self._targets: dict[tuple[str, int], _Cycle | None] = {}
        self._addresses: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="services", daemon=True)
        self._thread.start()

    def update(self, ports: list[ServicePort]) -> None:
        """Listen on every Service port (new ClusterIPs added to the namespace's lo); point
        each at its current ready endpoints."""
        for port in ports:
            if port.port in self.own_ports:
                continue
            if port.cluster_ip not in self._addresses:
                subprocess.run(
                    ["ip", "-n", self.pod.namespace, "addr", "add", f"{port.cluster_ip}/32",
                     "dev", "lo"],
                    capture_output=True, check=False,
                )  # fmt: skip
                self._addresses.add(port.cluster_ip)
            key = (port.cluster_ip, port.port)
            with self._lock:
                old = self._targets.get(key)
                if old is None or old.endpoints != port.endpoints:
                    self._targets[key] = _Cycle(port.endpoints) if port.endpoints else None
            if key not in self._listening:
                listener = in_namespace(self.pod.namespace, partial(socket.create_server, key))
                listener.setblocking(False)
                self._listening[key] = listener
                self._selector.register(listener, selectors.EVENT_READ, key)

    def _accept(self) -> None:
        while not self._stop.is_set():
            if not self._listening:
                self._stop.wait(0.2)
                continue
            for selected, _ in self._selector.select(timeout=0.2):
                key = selected.data
                try:
                    inside, _ = self._listening[key].accept()
                except OSError:
                    continue
                with self._lock:
                    targets = self._targets.get(key)
                target = next(targets) if targets is not None else None
                if target is None:  # no ready endpoint: refused, as kube-proxy rejects it
                    inside.close()
                    continue
                threading.Thread(target=self._connect, args=(inside, target), daemon=True).start()

    @staticmethod
    def _connect(inside: socket.socket, target: tuple[str, int]) -> None:
        inside.setblocking(True)
        try:
            outside = socket.create_connection(target, timeout=10)
        except OSError:
            inside.close()
            return
        outside.settimeout(None)
        threading.Thread(target=pump, args=(inside, outside), daemon=True).start()
        pump(outside, inside)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for listener in self._listening.values():
            with contextlib.suppress(OSError, KeyError, ValueError):
                self._selector.unregister(listener)
            listener.close()
        self._selector.close()


class _Cycle:
    """Round-robin over a Service port's endpoints (which it keeps, to notice a change)."""

    def __init__(self, endpoints: tuple[tuple[str, int], ...]) -> None:
        self.endpoints = endpoints
        self._next = itertools.cycle(endpoints)

    def __next__(self) -> tuple[str, int]:
        return next(self._next)
