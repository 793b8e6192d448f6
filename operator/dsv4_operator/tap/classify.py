"""One proxied exchange to a verdict (pure): was it a tool-calling chat completion, and how did
the response come out. Runs in the classifier process, never on the proxy's event loop."""

from __future__ import annotations

import json
from typing import Any

from dsv4_operator.leak.classifier import InvalidToolSchema, classify_response
from dsv4_operator.leak.sse import StreamError, assemble_stream
from dsv4_operator.leak.verdict import VerdictKind

#: What the proxy looks for in a request body before it keeps a copy of the response: a
#: cheap byte test; the classifier parses the JSON and decides for real.
TOOLS_MARKER = b'"tools"'


def tool_request(body: bytes) -> dict[str, Any] | None:
    """The parsed request when it is a chat completion offering tools, else None."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(request, dict) or not isinstance(request.get("tools"), list):
        return None
    return request if request["tools"] else None


def _must_call(request: dict[str, Any]) -> bool:
    choice = request.get("tool_choice")
    return choice == "required" or isinstance(choice, dict)


def classify_exchange(request_body: bytes, response_body: bytes) -> VerdictKind | None:
    """The verdict on one exchange; None when the request offered no tools (not counted)."""
    request = tool_request(request_body)
    if request is None:
        return None
    try:
        if bool(request.get("stream")):
            response = assemble_stream(response_body, require_done=True)
        else:
            response = json.loads(response_body)
        if not isinstance(response, dict):
            return VerdictKind.ERROR
        return classify_response(
            response, tools=request["tools"], must_call=_must_call(request)
        ).kind
    except (StreamError, UnicodeDecodeError, ValueError, InvalidToolSchema, TypeError):
        return VerdictKind.ERROR
