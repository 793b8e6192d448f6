"""Each culprit-search shadow router where the operator reaches it: at its Service's name.

kwok runs no container and the operator runs outside the cluster, so nothing answers at
`http://<deployment>-router-b<probe>.<namespace>.svc:<port>`. The operator's canary client
follows HTTP_PROXY (signals/http.py `canary`, as the guard's canary of the serving router
does), so `ShadowRouters` is a forward proxy the operator is started behind. For a shadow
router Service's host it does what the cluster and the router would: the Service's selector
finds the Running router pod; the pod's own rendered argv (`--pd-disaggregation`, its
`--prefill URL BOOTSTRAP_PORT` and `--decode URL`) names the engines; each URL's per-pod DNS
name is resolved to that pod's IP (ShadowEngines reports it and runs the double there); the
request goes to the decode engine (the server that answers the client in PD) once the prefill
pod it pairs with runs too. Every request it routed is recorded: tests assert the canary
reached the shadow engines, through the shadow router only. Any other host is refused (502).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx

from dsv4_devcluster.deployments import Cluster
from dsv4_operator.names import PROBE_LABEL, ROLE_LABEL, SHADOW_OF_LABEL

# Headers a proxy must not pass on (RFC 9110 7.6.1), and the length httpx sets itself.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "host"}


@dataclass(frozen=True)
class Routed:
    """One request the stand-in routed: the Service host asked for, the router pod that
    stood for it, and the decode and prefill pods its argv named."""

    host: str
    probe: str
    router_pod: str
    decode_pod: str
    decode_address: str  # IP:port
    prefill_pod: str


class RouteError(Exception):
    """The name does not lead to a running shadow pair (the client gets a 502 or 503)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == flag]


class ShadowRouters:
    """The forward proxy; `url` is what the operator's HTTP_PROXY names."""

    def __init__(self, cluster: Cluster, name: str = "dsv4-flash") -> None:
        self.cluster, self.name = cluster, name
        self.routed: list[Routed] = []
        self.refused: list[str] = []
        self._lock = threading.Lock()
        self._http = httpx.Client(trust_env=False, timeout=60)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ShadowRouters:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def _pod(self, name: str) -> dict[str, Any] | None:
        pods = self.cluster.pods(f"{SHADOW_OF_LABEL}={self.name}")
        return next((p for p in pods if p["metadata"]["name"] == name), None)

    def _engine_pod(self, url: str) -> tuple[str, str]:
        """(pod name, `IP:port`) of `http://<pod>.<service>.<namespace>.svc:<port>`."""
        parts = urlsplit(url)
        pod_name = (parts.hostname or "").split(".")[0]
        pod = self._pod(pod_name)
        status = (pod or {}).get("status") or {}
        if pod is None or status.get("phase") != "Running" or not status.get("podIP"):
            raise RouteError(503, f"engine pod {pod_name} is not running")
        return pod_name, f"{status['podIP']}:{parts.port or 80}"

    def route(self, host: str) -> Routed:
        """Where a request to `host` (`<service>.<namespace>.svc[:port]`) goes."""
        service_name, _, rest = host.partition(".")
        if not rest.startswith(f"{self.cluster.namespace}.svc"):
            raise RouteError(502, f"{host} is not a Service of this namespace")
        services = self.cluster.items("v1", "Service", f"{SHADOW_OF_LABEL}={self.name}")
        service = next((s for s in services if s["metadata"]["name"] == service_name), None)
        if service is None:
            raise RouteError(502, f"no shadow Service {service_name}")
        selector = service["spec"]["selector"]
        pods = [
            p
            for p in self.cluster.pods(",".join(f"{k}={v}" for k, v in selector.items()))
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        routers = [p for p in pods if p["metadata"]["labels"].get(ROLE_LABEL) == "router"]
        if not routers:
            raise RouteError(503, f"no running router pod behind {service_name}")
        router = routers[0]
        argv = list(router["spec"]["containers"][0]["command"])
        if "--pd-disaggregation" not in argv:
            raise RouteError(502, f"{router['metadata']['name']} is not a PD router")
        decodes, prefills = _flag_values(argv, "--decode"), _flag_values(argv, "--prefill")
        if len(decodes) != 1 or len(prefills) != 1:
            raise RouteError(502, f"expected one decode and one prefill, got {argv}")
        prefill_pod, _ = self._engine_pod(prefills[0])
        decode_pod, decode_address = self._engine_pod(decodes[0])
        return Routed(
            host=host,
            probe=router["metadata"]["labels"][PROBE_LABEL],
            router_pod=router["metadata"]["name"],
            decode_pod=decode_pod,
            decode_address=decode_address,
            prefill_pod=prefill_pod,
        )

    def _forward(self, method: str, target: str, headers: dict[str, str], body: bytes) -> Any:
        parts = urlsplit(target)
        routed = self.route(parts.netloc)
        url = f"http://{routed.decode_address}{parts.path}"
        if parts.query:
            url += f"?{parts.query}"
        with self._lock:
            self.routed.append(routed)
        return self._http.request(method, url, headers=headers, content=body)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        routers = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                try:
                    reply = routers._forward(self.command, self.path, headers, body)
                except RouteError as error:
                    with routers._lock:
                        routers.refused.append(f"{self.path}: {error}")
                    self.send_error(error.status, str(error))
                    return
                except httpx.HTTPError as error:
                    self.send_error(502, f"{type(error).__name__}")
                    return
                self.send_response(reply.status_code)
                for key, value in reply.headers.items():
                    if key.lower() not in HOP_BY_HOP | {"content-length", "content-encoding"}:
                        self.send_header(key, value)
                self.send_header("content-length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            do_GET = do_POST = _relay

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
