"""Instant Prometheus queries over httpx (I/O): a number, NoData, or a typed error.

Error messages name a status code or an error class only, never text of the reply: they end
up in `status.guard.lastMessage`, readable by anyone who can read the object.
"""

from __future__ import annotations

import math
import re

import httpx

# Prometheus's documented errorType values are short snake_case words (bad_data, timeout, ...).
_ERROR_TYPE = re.compile(r"^[a-z_]{1,32}$")


class PrometheusError(Exception):
    """The query could not be answered (HTTP error, timeout, bad response)."""


async def instant_value(client: httpx.AsyncClient, base_url: str, query: str) -> float | None:
    """Sum of an instant vector (or a scalar); None when empty or NaN (NoData)."""
    try:
        response = await client.get(f"{base_url.rstrip('/')}/api/v1/query", params={"query": query})
    except httpx.HTTPError as error:
        raise PrometheusError(type(error).__name__) from error
    if response.status_code >= 400:
        raise PrometheusError(f"HTTP {response.status_code}")
    try:
        body = response.json()
        if body.get("status") != "success":
            kind = str(body.get("errorType", ""))
            raise PrometheusError(
                f"query failed ({kind})" if _ERROR_TYPE.match(kind) else "query failed"
            )
        data = body.get("data", {})
        result = data.get("result")
        if data.get("resultType") == "scalar":
            values = [float(result[1])]
        else:
            values = [float(sample["value"][1]) for sample in result or []]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
        raise PrometheusError("the reply is not a Prometheus query result") from error
    values = [v for v in values if not math.isnan(v)]
    return sum(values) if values else None
