"""The suite's own rule on traffic, checked: the watch that fails a test which puts an address
on a host interface sees one added and removed at once, and a pod network leaves none."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import urllib.request

from dsv4_devcluster import wait_for
from dsv4_devcluster.netns import PodNetwork, namespaces

from .network_support import AddressWatch, host_addresses


def test_an_address_added_to_lo_for_a_moment_is_seen() -> None:
    # The same watch as the suite's, on a namespace of this test's own: its `lo` stands for
    # the host's (the suite's watch would rightly fail a test that touched the real one).
    with PodNetwork() as network:
        pod = network.pod()
        watch = AddressWatch(pod.namespace)
        ip = ["ip", "-n", pod.namespace, "addr"]

        def flash(address: str) -> None:
            for verb in ("add", "del"):
                subprocess.run([*ip, verb, address, "dev", "lo"], check=True)

        try:
            # `ip monitor` says nothing when it has subscribed: flash another address until
            # the watch reports one (on a busy machine the monitor starts late), so the
            # flash below is the one under test, not a race with the monitor's start.
            def subscribed() -> bool:
                flash("198.19.255.253/32")
                return ("lo", "198.19.255.253/32") in watch.added

            wait_for("the watch to subscribe", subscribed, timeout=60)
            flash("198.19.255.254/32")
            wait_for(
                "the watch to see the address",
                lambda: ("lo", "198.19.255.254/32") in watch.added,
                timeout=60,
            )
        finally:
            watch.stop()


def test_a_pod_network_reaches_the_hosts_loopback_and_is_reached_and_leaves_nothing() -> None:
    before = host_addresses()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    with PodNetwork() as network:
        pod = network.pod()
        pod.relay_loopback(port)
        inside = (
            "import http.server, urllib.request, urllib.error\n"
            "try:\n"
            f"    urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=10)\n"
            "except urllib.error.HTTPError as e:\n"
            "    assert e.code == 501  # the host's server answered through the relay\n"
            f"s = http.server.HTTPServer(('{pod.ip}', 8080),"
            " http.server.SimpleHTTPRequestHandler)\n"
            "s.handle_request()\n"
        )
        child = subprocess.Popen(pod.command([sys.executable, "-c", inside]))
        try:

            def answered() -> bool:
                try:
                    with urllib.request.urlopen(f"http://{pod.ip}:8080/", timeout=2) as reply:
                        return bool(reply.status == 200)
                except OSError:
                    return False

            wait_for("the pod's server at its address", answered, timeout=30)
            assert child.wait(timeout=30) == 0
        finally:
            child.kill()
        assert pod.namespace in namespaces()
        assert pod.ip not in {a for addresses in host_addresses().values() for a in addresses}
    server.shutdown()
    assert pod.namespace not in namespaces()
    after = host_addresses()
    assert pod.host_link not in after

    # Other pod networks (another test of this run, another run on the machine) come and go
    # meanwhile: their host ends are theirs to remove.
    def own(addresses: dict[str, set[str]]) -> dict[str, set[str]]:
        return {name: found for name, found in addresses.items() if not name.startswith("d4h")}

    assert own(after) == own(before), (before, after)
