"""The host's network addresses, read and watched (`ip`): the suite's rule that a test adds no
address to an interface the host had (tests/integration/conftest.py) and its own test."""

from __future__ import annotations

import json
import re
import subprocess
import threading


def _ip(namespace: str | None) -> list[str]:
    return ["ip", "-n", namespace] if namespace else ["ip"]


def host_addresses(namespace: str | None = None) -> dict[str, set[str]]:
    """Interface name -> its addresses (`ip -j addr`), in the harness's network namespace
    (or the one named)."""
    done = subprocess.run(
        [*_ip(namespace), "-j", "addr"], capture_output=True, text=True, check=True
    )
    return {
        link["ifname"]: {a["local"] for a in link.get("addr_info", [])}
        for link in json.loads(done.stdout)
    }


_ADDED = re.compile(r"^\d+: (?P<link>\S+)\s+inet6? (?P<address>\S+)")


class AddressWatch:
    """The host's address events (`ip -o monitor address`) since the run began, on the
    interfaces it had then: an address added and removed again within a test is seen too."""

    def __init__(self, namespace: str | None = None) -> None:
        self.before = host_addresses(namespace)
        self.added: list[tuple[str, str]] = []
        self._proc = subprocess.Popen(
            [*_ip(namespace), "-o", "monitor", "address"], stdout=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            match = _ADDED.match(line)  # "Deleted ..." lines do not match
            if match and match["link"] in self.before:
                self.added.append((match["link"], match["address"]))

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
