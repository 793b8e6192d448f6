"""The tap's reading of one relayed connection (tap/observe.py, pure): a response that ends
when the router closes the connection is handed over at the close, one cut short too, and a
close after a response that had ended hands nothing more."""

from __future__ import annotations

from dsv4_operator.tap.observe import ConnectionObserver, Hooks, Unobserved

BODY = b'{"stream": true, "tools": []}'
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
STREAM = b'data: {"choices": []}\n\ndata: [DONE]\n\n'


def _observer() -> tuple[ConnectionObserver, list[tuple[bytes, bytes]], list[Unobserved]]:
    exchanges: list[tuple[bytes, bytes]] = []
    unobserved: list[Unobserved] = []

    def exchange(request: bytes, response: bytes) -> bool:
        exchanges.append((request, response))
        return True  # the classifier took it

    hooks = Hooks(
        request=lambda tools: None,
        exchange=exchange,
        too_large=lambda: None,
        unobserved=unobserved.append,
        capture_limit=1 << 20,
    )
    return ConnectionObserver(hooks), exchanges, unobserved


def test_a_close_delimited_response_is_handed_over_when_the_router_closes() -> None:
    for head in (
        b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
    ):
        observer, exchanges, unobserved = _observer()
        observer.feed_request(REQUEST)
        observer.feed_response(head + STREAM[:10])
        observer.feed_response(STREAM[10:])
        assert exchanges == []  # the parser cannot know the stream has ended
        observer.router_closed()
        assert exchanges == [(BODY, STREAM)]
        assert unobserved == []


def test_a_response_cut_short_is_handed_over_as_the_client_got_it() -> None:
    observer, exchanges, _ = _observer()
    observer.feed_request(REQUEST)
    observer.feed_response(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + STREAM[:10])
    observer.router_closed()
    assert [response for _, response in exchanges] == [STREAM[:10]]


def test_a_close_after_an_ended_response_hands_nothing_more() -> None:
    observer, exchanges, _ = _observer()
    observer.feed_request(REQUEST)
    observer.feed_response(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(STREAM) + STREAM)
    assert len(exchanges) == 1
    observer.router_closed()
    observer.router_closed()
    assert len(exchanges) == 1
