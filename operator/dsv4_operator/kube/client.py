"""Async Kubernetes REST client over httpx: get, list, server-side apply, delete, status, events.

The httpx transport is the seam: tests and the operator share this code, and a test can count
the write requests that went through it.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import Any

import httpx
from kubernetes import config as kube_config
from kubernetes.client import Configuration

from dsv4_operator.kube.errors import KubeError, NotFound, Unreachable, error_for
from dsv4_operator.kube.resources import Resource, resource_of

Obj = dict[str, Any]
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def load_configuration(kubeconfig: str | None = None) -> Configuration:
    """In-cluster service account when available, else the kubeconfig (KUBECONFIG honoured)."""
    cfg = Configuration()
    if kubeconfig is None:
        try:
            kube_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cfg
        except kube_config.ConfigException:
            pass
    kube_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    return cfg


def http_client_for(cfg: Configuration, timeout: float = 30.0) -> httpx.AsyncClient:
    """An httpx client with the credentials of a kubernetes Configuration."""
    ctx = (
        ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.ssl_ca_cert
        else (ssl.create_default_context())
    )
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file and cfg.key_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    headers = {"Accept": "application/json"}
    token = cfg.get_api_key_with_prefix("authorization") or cfg.get_api_key_with_prefix(
        "BearerToken"
    )
    if token:
        headers["Authorization"] = token
    return httpx.AsyncClient(base_url=cfg.host, verify=ctx, headers=headers, timeout=timeout)


class KubeClient:
    """The operations the operator needs, with typed errors and a write counter."""

    def __init__(self, http: httpx.AsyncClient, field_manager: str = "dsv4-operator") -> None:
        self.http = http
        self.field_manager = field_manager
        self.writes = 0

    @classmethod
    def from_environment(
        cls, kubeconfig: str | None = None, field_manager: str = "dsv4-operator"
    ) -> KubeClient:
        return cls(http_client_for(load_configuration(kubeconfig)), field_manager)

    async def close(self) -> None:
        await self.http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        if method in WRITE_METHODS:
            self.writes += 1
        try:
            response = await self.http.request(
                method,
                path,
                params=params,
                content=json.dumps(body) if body is not None else None,
                headers={"Content-Type": content_type} if body is not None else None,
            )
        except httpx.HTTPError as error:
            raise Unreachable(0, type(error).__name__, str(error)) from error
        if response.status_code >= 400:
            try:
                status = response.json()
                reason, message = status.get("reason", ""), status.get("message", response.text)
            except ValueError:
                reason, message = response.reason_phrase, response.text
            raise error_for(response.status_code, reason, message)
        data: Obj = response.json() if response.content else {}
        return data

    async def get(self, res: Resource, namespace: str | None, name: str) -> Obj | None:
        try:
            return await self._request("GET", res.path(namespace, name))
        except NotFound:
            return None

    async def list(
        self, res: Resource, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        params = {}
        if labels:
            params["labelSelector"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        try:
            data = await self._request("GET", res.path(namespace), params=params)
        except NotFound:
            return []  # the type is not installed (e.g. ServiceMonitor without prometheus-operator)
        items: list[Obj] = data.get("items", [])
        for item in items:  # list responses omit these per item
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return items

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply with this client's field manager (force: the operator owns them)."""
        meta = obj["metadata"]
        return await self._request(
            "PATCH",
            resource_of(obj).path(meta.get("namespace"), meta["name"]),
            params={"fieldManager": self.field_manager, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    async def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return await self._request("POST", resource_of(obj).path(meta.get("namespace")), body=obj)

    async def delete(self, res: Resource, namespace: str | None, name: str) -> bool:
        """Delete with background propagation; False when it was already gone."""
        try:
            await self._request(
                "DELETE",
                res.path(namespace, name),
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "propagationPolicy": "Background",
                },
            )
            return True
        except NotFound:
            return False

    async def apply_status(self, res: Resource, namespace: str, name: str, status: Obj) -> Obj:
        """Server-side apply of `.status` (fields this manager no longer sets are removed)."""
        body = {
            "apiVersion": res.api_version,
            "kind": res.kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        return await self._request(
            "PATCH",
            res.path(namespace, name) + "/status",
            params={"fieldManager": self.field_manager, "force": "true"},
            body=body,
            content_type="application/apply-patch+yaml",
        )


__all__ = ["KubeClient", "KubeError", "load_configuration"]
