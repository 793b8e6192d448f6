"""The operator's event loop (event_loop.py): which addresses skip uvloop's resolver. The
connections, and the names that still go to it, are tests/integration/test_event_loop.py."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import uvloop

from dsv4_operator.event_loop import Loop, numeric_addrinfo


@pytest.mark.parametrize(
    ("host", "port", "numeric"),
    [
        ("10.0.3.7", 9100, True),
        ("fd00::7", 9100, True),
        (b"10.0.3.7", b"9100", True),
        ("dsv4-flash-router.default.svc", 8000, False),
        ("10.0.3.7", "http", False),  # a service name: uvloop's resolver knows it
        (None, 9100, False),
    ],
)
def test_numeric_addrinfo_answers_ip_addresses_and_numeric_ports_alone(
    host: Any, port: Any, numeric: bool
) -> None:
    found = numeric_addrinfo(host, port, 0, socket.SOCK_STREAM, 0, 0)
    assert (found is not None) is numeric
    if found is not None:
        assert found[0][4][1] == int(port)


def test_the_loop_is_uvloops() -> None:
    loop = Loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
