"""The native relay probe's copy reader (main.go): each connection's framed copies parsed by the
tap's own ConnectionObserver, each tool-calling exchange classified, as the tap does."""

from __future__ import annotations

import struct
import sys

from dsv4_operator.tap.classify import classify_exchange
from dsv4_operator.tap.observe import ConnectionObserver, Hooks
from dsv4_operator.tap.proxy import CAPTURE_LIMIT

_RECORD = struct.Struct("<IBI")  # connection, kind (0 request, 1 response, 2 closed), length


def _classified(request: bytes, response: bytes) -> bool:
    classify_exchange(request, response)
    return True


def main() -> None:
    hooks = Hooks(
        request=lambda tools: None,
        exchange=_classified,
        too_large=lambda: None,
        unobserved=lambda reason: None,
        capture_limit=CAPTURE_LIMIT,
    )
    observers: dict[int, ConnectionObserver] = {}
    stream = sys.stdin.buffer
    while len(head := stream.read(_RECORD.size)) == _RECORD.size:
        conn, kind, size = _RECORD.unpack(head)
        data = stream.read(size) if size else b""
        observer = observers.get(conn) or observers.setdefault(conn, ConnectionObserver(hooks))
        if kind == 0:
            observer.feed_request(data)
        elif kind == 1:
            observer.feed_response(data)
        else:
            observer.router_closed()
            del observers[conn]


if __name__ == "__main__":
    main()
