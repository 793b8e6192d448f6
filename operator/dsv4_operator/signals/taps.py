"""Scraping the leak taps (I/O): where a pod serves a path, and one read of a /metrics page.

What the counts mean, and what is new since the last scrape, is the guard's (guard/taps.py).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from dsv4_operator.guard.taps import parse_counts
from dsv4_operator.signals.http import Pages

TAP_SCRAPE_TIMEOUT = 2.0  # a tap answers from memory; a slower one is as good as down


def pod_url(pod_ip: str, port: int, path: str = "/metrics") -> str:
    """The URL of `path` on `port` of the pod at `pod_ip` (an IPv6 address in brackets)."""
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{port}{path}"


async def scrape(
    pages: Pages, url: str, parse: Callable[[str], dict[str, float]] = parse_counts
) -> tuple[dict[str, float], str | None]:
    """(what `parse` makes of a /metrics page, a tap's verdict counts by default, None), or
    ({}, why it could not be read)."""
    try:
        return parse(await pages.text(url, TAP_SCRAPE_TIMEOUT)), None
    except httpx.HTTPError as error:
        return {}, type(error).__name__
    except ValueError:  # not the Prometheus text format: a wrong URL
        return {}, "not Prometheus metrics"
