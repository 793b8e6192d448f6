"""The harness's ports: `free_port` hands out none the kernel may pick for a connection, none
bound, and none another test process was given and may not have bound yet."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4_devcluster import process
from dsv4_devcluster.process import RESERVED_S, ephemeral_ports, free_port, reserve_port

pytestmark = pytest.mark.integration

PICKS = 300
PICKER = f"""
from dsv4_devcluster.process import free_port
print(" ".join(str(free_port()) for _ in range({PICKS})))
"""


def test_a_free_port_is_outside_the_kernels_own_range_and_binds() -> None:
    low, high = ephemeral_ports()
    port = free_port()
    assert not low <= port <= high, (port, low, high)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()


def test_two_processes_picking_at_once_are_never_given_the_same_port() -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", PICKER], stdout=subprocess.PIPE, text=True
    )  # picks while this process does
    mine = [free_port() for _ in range(PICKS)]
    theirs, _ = other.communicate(timeout=120)
    assert other.returncode == 0
    given = mine + [int(port) for port in theirs.split()]
    assert len(given) == 2 * PICKS
    assert len(set(given)) == len(given), "a port was handed out twice"


def test_a_bound_or_reserved_port_is_passed_over_until_its_reservation_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bound, free = free_port(), free_port()  # two ports no other test will use meanwhile
    monkeypatch.setattr(process, "PORT_RESERVATIONS", tmp_path)  # where neither is reserved
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", bound))
        listener.listen()
        assert reserve_port([bound, free]) == free
        with pytest.raises(RuntimeError, match="no free TCP port among 2 candidates"):
            reserve_port([bound, free])  # one bound, one handed out
        later = time.time() + RESERVED_S + 1
        assert reserve_port([bound, free], now=lambda: later) == free
    assert (tmp_path / str(free)).is_file()
    assert not (tmp_path / str(bound)).exists()
