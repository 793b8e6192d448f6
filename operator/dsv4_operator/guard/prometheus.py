"""Instant Prometheus queries over httpx (I/O): a number, NoData, or a typed error."""

from __future__ import annotations

import math

import httpx


class PrometheusError(Exception):
    """The query could not be answered (HTTP error, timeout, bad response)."""


async def instant_value(client: httpx.AsyncClient, base_url: str, query: str) -> float | None:
    """Sum of an instant vector (or a scalar); None when empty or NaN (NoData)."""
    try:
        response = await client.get(f"{base_url.rstrip('/')}/api/v1/query", params={"query": query})
        response.raise_for_status()
        body = response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise PrometheusError(f"{type(error).__name__}: {error}") from error
    if body.get("status") != "success":
        raise PrometheusError(f"query failed: {body.get('error', body)}")
    data = body.get("data", {})
    result = data.get("result")
    if data.get("resultType") == "scalar":
        values = [float(result[1])]
    else:
        values = [float(sample["value"][1]) for sample in result or []]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) if values else None
