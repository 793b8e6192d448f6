"""An in-process stand-in for the API server's authentication layer (`httpx.MockTransport`):
it accepts the bearer tokens it is told are valid and answers 401 Unauthorized to anything
else. The credential tests of the unit tier and the exec-plugin test of the integration tier
both talk to it."""

from __future__ import annotations

import httpx

from dsv4_operator.kube.client import KubeClient

SERVER = "https://kube.test:6443"


class AuthServer:
    """An API server that knows which bearer tokens are valid and records what it was sent."""

    def __init__(self, *valid: str) -> None:
        self.valid = set(valid)
        self.seen: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        header = request.headers.get("Authorization")
        self.seen.append(header)
        if header is None or header.removeprefix("Bearer ") not in self.valid:
            status = {"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"}
            return httpx.Response(401, json=status)
        return httpx.Response(200, json={"kind": "Pod", "metadata": {"name": "p"}})

    def client(self, auth: httpx.Auth) -> KubeClient:
        return KubeClient(
            httpx.AsyncClient(base_url=SERVER, transport=httpx.MockTransport(self), auth=auth)
        )
