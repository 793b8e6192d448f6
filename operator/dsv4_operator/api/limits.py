"""The API's bounds: fixed ports, duration ranges, number limits and the quantity grammar."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from dsv4_operator.api.times import Duration, DurationBounds

# The engine's HTTP port inside every engine pod (sglang `--port`); fixed so probes and the
# router can be rendered without reading the pod.
ENGINE_PORT = 30000
# sgl-model-gateway `--prometheus-port` default (sglang_router router_args.py).
ROUTER_METRICS_PORT = 29000
# The leak tap sidecar of every router pod: its relay port and its /metrics port.
TAP_PORT = 8100
TAP_METRICS_PORT = 9100
# The torch.distributed rendezvous port on the leader of a multi-node role
# (`--dist-init-addr <leader>:20000`, the port of the LeaderWorkerSet SGLang example). Under DP
# attention every node derives the 6 ports above it (sglang server_args.py PortArgs:
# `port_base = dist_init_port + 1` .. `+ 5`), clear of the ports above.
DIST_INIT_PORT = 20000

# Durations, each with the range that keeps one object's cost to the operator bounded.
# The canary's hard floor; the operator's configuration sets a higher one (10s by default,
# trust.TrustPolicy.min_canary_interval) that tests lower to keep their runs short.
CanaryInterval = Annotated[Duration, DurationBounds("1s", "24h")]
OomWindow = Annotated[Duration, DurationBounds("1m", "24h")]
BakeTime = Annotated[Duration, DurationBounds("0s", "168h")]
ScrapeInterval = Annotated[Duration, DurationBounds("5s", "1h")]
TapInterval = Annotated[Duration, DurationBounds("1s", "5m")]
BisectTimeLimit = Annotated[Duration, DurationBounds("10m", "168h")]

# Upper bounds of the numbers (docs/security.md#bounds): far above any real deployment, low
# enough that one object cannot make the operator render, probe or plan without end.
MAX_ROLE_REPLICAS = 128
MAX_ROUTER_REPLICAS = 32
MAX_GPUS_PER_NODE = 64
# A replica spans at most this many nodes (one LeaderWorkerSet group of leader + workers).
MAX_NODES_PER_REPLICA = 16
MAX_GPUS_PER_REPLICA = 256
MAX_CONTEXT_TOKENS = 1 << 24
MAX_CANARY_SESSIONS = 64
MAX_CANARY_ROUNDS = 16
MAX_LIST_ITEMS = 128
MAX_ARG_LENGTH = 4096
MAX_VALUE_LENGTH = 32768

# A Kubernetes resource quantity without a sign (apimachinery's quantity grammar).
# The exponent is an integer: apimachinery's parser (`splitREString`) refuses `1e1.5`, which
# its documented grammar would allow.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
)
Quantity = Annotated[
    Annotated[int, Field(ge=0, le=1 << 53)]
    | Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]
