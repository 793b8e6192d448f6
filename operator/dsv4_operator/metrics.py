"""Operator metrics (prometheus-client), served on DSV4_METRICS_PORT."""

from __future__ import annotations

from prometheus_client import Counter, Histogram, start_http_server

RECONCILES = Counter("dsv4_reconciles_total", "Reconcile passes by result.", ["result"])
RECONCILE_SECONDS = Histogram("dsv4_reconcile_duration_seconds", "Duration of one reconcile pass.")
WRITES = Counter(
    "dsv4_api_writes_total", "API write requests made by reconciles (0 growth when idle)."
)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    start_http_server(port, addr=addr)
