"""The proxy variables a test clears: with one named, the guard's spec-URL client is httpx's own
transport (signals/http.py), so a test of the aiohttp one must run without them."""

from __future__ import annotations

import pytest

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset every proxy variable, in both spellings, for this test."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
