"""Scraping the leak taps (I/O): where a router pod's tap serves /metrics, and one read of it.

What the counts mean, and what is new since the last scrape, is the guard's (guard/taps.py).
"""

from __future__ import annotations

import httpx

from dsv4_operator.guard.taps import parse_counts

TAP_SCRAPE_TIMEOUT = 2.0  # a tap answers from memory; a slower one is as good as down


def pod_tap_url(pod_ip: str, port: int) -> str:
    """The /metrics URL of the tap in the pod at `pod_ip` (an IPv6 address in brackets)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{port}/metrics"


async def scrape_tap(http: httpx.AsyncClient, url: str) -> tuple[dict[str, float], str | None]:
    """(a tap's verdict counts, None), or ({}, why they could not be read)."""
    try:
        reply = await http.get(url, timeout=TAP_SCRAPE_TIMEOUT)
        reply.raise_for_status()
        return parse_counts(reply.text), None
    except httpx.HTTPError as error:
        return {}, type(error).__name__
    except ValueError:  # not the Prometheus text format: a wrong URL
        return {}, "not Prometheus metrics"
