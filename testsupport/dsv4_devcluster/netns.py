"""Pod networks for the processes a test runs in a pod's place: each pod address lives in a
network namespace the harness made, never on one of the host's interfaces.

A process a test runs as a pod (the operator with its chart's settings, say) must be reachable
at the pod IP it reports, the way the API server reaches a webhook Service's endpoints; and
EndpointSlices refuse loopback addresses. So each such pod gets a namespace of its own:

* ``ip netns add`` and a veth pair: the pod's end inside, with the pod IP (a /30 of a /24
  drawn from 198.18.0.0/15, RFC 2544's benchmarking range, per :class:`PodNetwork`), and the
  host's end with the other address of the /30, so that the host routes the pod IP over the
  pair and nowhere else. The namespace has no default route: whatever its process sends
  beyond the host's end fails at once.
* :meth:`Pod.relay_loopback`: the pod's ``127.0.0.1:port`` is the host's (a thread accepts in
  the pod's namespace and connects in the host's), so a kubeconfig for the dev control plane
  on the host's loopback works unchanged inside.
* :meth:`Pod.command`: the argv prefix that runs a program inside (``ip netns exec``).

Everything is removed on exit; namespaces of a harness that was SIGKILLed (their names carry
its PID) are removed by the next one. Needs iproute2 and CAP_NET_ADMIN (root in the sandbox).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import secrets
import select
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TypeVar

PREFIX = "dsv4pod"
ETC_NETNS = "/etc/netns"
_CLONE_NEWNET = 0x40000000
_BENCHMARKING = ipaddress.IPv4Network("198.18.0.0/15")
T = TypeVar("T")


class PodNetworkError(RuntimeError):
    """A namespace, link or address could not be made; the message has iproute2's reason."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PodNetworkError(
            f"`ip {' '.join(args)}` failed (needs iproute2 and CAP_NET_ADMIN): "
            f"{done.stderr.strip()}"
        )


def in_namespace(name: str, make: Callable[[], T]) -> T:
    """`make()` run on a thread that has entered network namespace `name` (a socket made
    there stays there); the calling thread's namespace is never changed."""
    libc = ctypes.CDLL(None, use_errno=True)
    result: list[T] = []
    failure: list[BaseException] = []

    def enter_and_make() -> None:
        try:
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            try:
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise PodNetworkError(f"setns into {name}: {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as error:
            failure.append(error)

    thread = threading.Thread(target=enter_and_make, name=f"netns-{name}")
    thread.start()
    thread.join()  # the thread ends inside the namespace; nothing else runs on it
    if failure:
        raise failure[0]
    return result[0]


def pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


class _LoopbackRelay:
    """Connections to 127.0.0.1:port inside a namespace, relayed to the host's 127.0.0.1:port."""

    def __init__(self, namespace: str, port: int) -> None:
        self.port = port
        self.listener = in_namespace(
            namespace, lambda: socket.create_server(("127.0.0.1", port), reuse_port=False)
        )
        self._stop = threading.Event()
        self._connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name=f"relay-{port}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.listener], [], [], 0.2)
            if not ready:
                continue
            try:
                inside, _ = self.listener.accept()
                outside = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            except OSError:
                continue  # the caller sees a closed connection and retries
            outside.settimeout(None)
            self._connections += [inside, outside]
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.listener.close()
        for conn in self._connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


class Pod:
    """One pod's network namespace: its address, a way to run a program inside, relays."""

    def __init__(self, namespace: str, ip: str, host_ip: str, host_link: str) -> None:
        self.namespace, self.ip, self.host_ip, self.host_link = namespace, ip, host_ip, host_link
        self._relays: list[_LoopbackRelay] = []

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the pod's namespace (it keeps its PID: `ip` execs it)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def write_hosts(self, text: str) -> None:
        """The pod's /etc/hosts (`ip netns exec` binds /etc/netns/NAME/hosts over it): names
        of other pods, as cluster DNS would answer them. Rewritten in place, so that a
        process already started sees the change."""
        path = Path(ETC_NETNS, self.namespace, "hosts")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a+") as hosts:
            hosts.seek(0)
            if hosts.read() != text:
                hosts.seek(0)
                hosts.truncate()
                hosts.write(text)

    def relay_loopback(self, port: int) -> None:
        """Make the host's 127.0.0.1:`port` (the API server, say) the pod's 127.0.0.1:`port`."""
        self._relays.append(_LoopbackRelay(self.namespace, port))

    def close(self) -> None:
        for relay in self._relays:
            relay.close()
        self._relays.clear()


class PodNetwork:
    """Pods with routable addresses, each in a namespace of its own, for one test run.

    ``with PodNetwork() as net: pod = net.pod()`` gives the next pod; ``net.pod(ip)`` the one
    at an address handed out before (a replacement pod takes its predecessor's address)."""

    def __init__(self) -> None:
        # A /24 of its own per run, so that two runs on one machine never share an address.
        subnets = list(_BENCHMARKING.subnets(new_prefix=24))
        self.subnet = subnets[secrets.randbelow(len(subnets))]
        self.tag = f"{os.getpid():x}{secrets.token_hex(2)}"
        self._pods: dict[str, Pod] = {}

    def __enter__(self) -> PodNetwork:
        sweep_stale_namespaces()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def pod(self, ip: str | None = None) -> Pod:
        if ip is not None:
            return self._pods[ip]
        taken = {self._index(p) for p in self._pods.values()}
        index = next((i for i in range(63) if i not in taken), None)
        if index is None:
            raise PodNetworkError(f"{self.subnet} holds at most 63 pods at once")
        base = int(self.subnet.network_address) + 4 * index
        host_ip, pod_ip = str(ipaddress.ip_address(base + 1)), str(ipaddress.ip_address(base + 2))
        namespace = f"{PREFIX}-{os.getpid()}-{self.tag}-{index}"
        host_link, pod_link = f"d4h{self.tag}{index}"[:15], f"d4p{self.tag}{index}"[:15]
        _ip("netns", "add", namespace)
        pod = Pod(namespace, pod_ip, host_ip, host_link)
        self._pods[pod_ip] = pod
        _ip("link", "add", host_link, "type", "veth", "peer", "name", pod_link)
        _ip("link", "set", pod_link, "netns", namespace)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_link)
        _ip("link", "set", host_link, "up")
        _ip("-n", namespace, "addr", "add", f"{pod_ip}/30", "dev", pod_link)
        _ip("-n", namespace, "link", "set", pod_link, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        return pod

    def _index(self, pod: Pod) -> int:
        return (int(ipaddress.ip_address(pod.ip)) - int(self.subnet.network_address)) // 4

    def route_between_pods(self, pod: Pod) -> None:
        """Let `pod` reach the other pods of this network (as a CNI bridge would): a route to
        the run's /24 via the host's end, which forwards between the pairs (that link's own
        forwarding switch; the host's global one is left alone)."""
        _ip("-n", pod.namespace, "route", "add", str(self.subnet), "via", pod.host_ip)
        Path(f"/proc/sys/net/ipv4/conf/{pod.host_link}/forwarding").write_text("1")

    def remove(self, pod: Pod) -> None:
        """Remove one pod's namespace and pair; its address may be handed out again."""
        pod.close()
        # The kernel frees a deleted namespace's links later; the pair goes now.
        subprocess.run(["ip", "link", "del", pod.host_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", pod.namespace], capture_output=True)
        shutil.rmtree(Path(ETC_NETNS, pod.namespace), ignore_errors=True)
        self._pods.pop(pod.ip, None)

    def close(self) -> None:
        """Stop the relays and remove every namespace (its veth pair and routes go with it)."""
        for pod in list(self._pods.values()):
            self.remove(pod)


def namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def sweep_stale_namespaces() -> None:
    """Remove the pod namespaces of harness processes that are gone (SIGKILLed)."""
    for name in namespaces():
        parts = name.split("-")
        if parts[0] != PREFIX or len(parts) < 3 or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
            shutil.rmtree(Path(ETC_NETNS, name), ignore_errors=True)
        except PermissionError:
            pass
