"""Async Kubernetes REST client over httpx: get, list, server-side apply, delete, status, events.

The httpx transport is the seam: tests and the operator share this code, and a test can count
the write requests that went through it.

Credentials are looked up on every request, never cached for the client's life (`KubeAuth`):
the in-cluster service-account token is a projected token the kubelet rotates (hourly), so its
file is read again whenever it changes; a kubeconfig token comes from the kubernetes client's
loader, which re-runs an exec plugin when its credential expires. A 401 makes the client log in
again once (re-read the token file, or reload the kubeconfig, which re-runs its exec plugin)
and retry the request; a second 401 raises `KubeError` with `status == 401`. Client
certificates are read once (an exec plugin that returns certificates is not re-run).
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import json
import os
import re
import ssl
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from pathlib import Path
from typing import Protocol

import httpx
from kubernetes import config as kube_config
from kubernetes.client import Configuration
from kubernetes.config.incluster_config import SERVICE_TOKEN_FILENAME

from dsv4_operator.aiohttp_transport import AiohttpTransport, aiohttp_session, environment_proxies
from dsv4_operator.kube.errors import KubeError, NotFound, Unreachable, error_for
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import EVENT, Resource, resource_of

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# How long a connection to the API server is kept between two requests (httpx's default).
API_KEEPALIVE_S = 5.0
# (verb, resource plural) of every request made, e.g. ("list", "pods"), ("patch", "statefulsets")
RequestHook = Callable[[str, str], None]


# --- credentials ----------------------------------------------------------------------------


class Credentials(Protocol):
    """Where the `Authorization` header comes from."""

    def header(self) -> str | None:
        """The header for the next request (None: send none); cheap, called per request."""
        ...

    def relogin(self) -> None:
        """Obtain fresh credentials after a 401 (may block: it can run an exec plugin)."""
        ...


class TokenFile:
    """A bearer token in a file, read again whenever the file changes (or after a 401).

    The kubelet rotates a projected service-account token by swapping a symlink, so a change
    shows in `stat` (inode, size, mtime). A file that cannot be read keeps the last token.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int, int] | None = None
        self._token: str | None = None

    def header(self) -> str | None:
        try:
            st = self.path.stat()
        except OSError:
            return self._bearer()
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen != self._seen:
            self._read(seen)
        return self._bearer()

    def relogin(self) -> None:
        self._seen = None

    def _read(self, seen: tuple[int, int, int]) -> None:
        try:
            token = self.path.read_text().strip()
        except OSError:
            return
        if token:
            self._token, self._seen = token, seen

    def _bearer(self) -> str | None:
        return f"Bearer {self._token}" if self._token else None


class ConfigurationCredentials:
    """The `Authorization` of a kubernetes `Configuration`; `reload` builds a fresh one.

    Asking the configuration per request runs its refresh hook (the kubeconfig loader re-runs
    an exec plugin whose credential expired); `relogin` calls `reload` (None: nothing to do).
    """

    def __init__(
        self, cfg: Configuration, reload: Callable[[], Configuration] | None = None
    ) -> None:
        self.cfg = cfg
        self.reload = reload

    def header(self) -> str | None:
        get = self.cfg.get_api_key_with_prefix
        token: str | None = get("authorization") or get("BearerToken")
        return token

    def relogin(self) -> None:
        if self.reload is not None:
            self.cfg = self.reload()


class KubeAuth(httpx.Auth):
    """httpx auth: the current header on every request; on a 401, one re-login and one retry.

    Concurrent requests that fail together log in once: a request whose 401 came after
    another request's re-login retries with the new credentials without logging in again.
    """

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self._logins = 0  # re-logins so far
        self._lock: asyncio.Lock | None = None

    def _authorize(self, request: httpx.Request) -> int:
        header = self.credentials.header()
        if header:
            request.headers["Authorization"] = header
        else:
            request.headers.pop("Authorization", None)
        return self._logins

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response]:
        logins = self._authorize(request)
        response = yield request
        if response.status_code == 401:
            if self._logins == logins:
                self.credentials.relogin()
                self._logins += 1
            self._authorize(request)
            yield request

    async def async_auth_flow(
        self, request: httpx.Request
    ) -> AsyncGenerator[httpx.Request, httpx.Response]:
        logins = self._authorize(request)
        response = yield request
        if response.status_code == 401:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self._logins == logins:
                    await asyncio.to_thread(self.credentials.relogin)
                    self._logins += 1
            self._authorize(request)
            yield request


def load_credentials(kubeconfig: str | None = None) -> tuple[Configuration, Credentials]:
    """In-cluster service account when available, else the kubeconfig (KUBECONFIG honoured).

    Returns the configuration (host, TLS) and where the bearer token comes from: the
    service-account token file in a pod, else the kubeconfig, reloaded on a re-login.
    """
    if kubeconfig is None:
        cfg = Configuration()
        try:
            kube_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cfg, TokenFile(SERVICE_TOKEN_FILENAME)
        except kube_config.ConfigException:
            pass

    def load() -> Configuration:
        cfg = Configuration()
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        return cfg

    cfg = load()
    return cfg, ConfigurationCredentials(cfg, reload=load)


def load_configuration(kubeconfig: str | None = None) -> Configuration:
    """In-cluster service account when available, else the kubeconfig (KUBECONFIG honoured)."""
    return load_credentials(kubeconfig)[0]


def http_client_for(
    cfg: Configuration,
    timeout: float = 30.0,
    credentials: Credentials | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An httpx client with the TLS settings of a kubernetes Configuration and `KubeAuth`.

    `credentials` default to the configuration's own (looked up per request, no re-login);
    `transport` replaces the network (tests). Without one the connections are aiohttp's
    (aiohttp_transport.py: httpcore's pool polls every kept connection before each request,
    a quarter of the operator's CPU while it creates a fleet's children), unless the
    environment names a proxy: httpx's own transport then keeps its proxy rules.
    """
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
    auth = KubeAuth(credentials or ConfigurationCredentials(cfg))
    if transport is None and not environment_proxies():
        transport = AiohttpTransport(aiohttp_session(ctx, API_KEEPALIVE_S))
    return httpx.AsyncClient(
        base_url=cfg.host,
        verify=ctx,
        headers={"Accept": "application/json"},
        auth=auth,
        timeout=timeout,
        transport=transport,
    )


# --- client ---------------------------------------------------------------------------------


# Characters YAML may not carry raw (DEL, C1 controls, U+FFFE/U+FFFF) or reads as a line
# break that a quoted scalar folds to a space (NEL, U+2028, U+2029); json.dumps escapes only
# the C0 controls when it writes raw UTF-8.
_YAML_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def yaml_safe_json(body: object) -> bytes:
    """JSON that an apply-patch+yaml body may be: raw UTF-8, never the \\u surrogate escapes
    json.dumps writes for non-BMP characters (YAML refuses them), and the characters YAML
    refuses raw written as \\u escapes (which it accepts)."""
    text = json.dumps(body, ensure_ascii=False)
    return _YAML_UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode()


# The API server answers a GET with the object's metadata only (no data, no spec).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class KubeClient:
    """The operations the operator needs, with typed errors and a write counter.

    Every failed call raises a `KubeError` (subclass by status; `Unreachable` when the server
    was not reached); a 401 that survives one re-login is a `KubeError` with `status == 401`.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        field_manager: str = "dsv4-operator",
        on_request: RequestHook | None = None,
    ) -> None:
        self.http = http
        self.field_manager = field_manager
        self.on_request = on_request
        self.writes = 0
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()

    @classmethod
    def from_environment(
        cls,
        kubeconfig: str | None = None,
        field_manager: str = "dsv4-operator",
        on_request: RequestHook | None = None,
    ) -> KubeClient:
        cfg, credentials = load_credentials(kubeconfig)
        return cls(http_client_for(cfg, credentials=credentials), field_manager, on_request)

    async def close(self) -> None:
        await self.http.aclose()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        params: Mapping[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
        accept: str | None = None,
    ) -> Obj:
        if method in WRITE_METHODS and not (params and "dryRun" in params):
            self.writes += 1  # a dry run stores nothing
        self.requests[verb, resource] += 1
        if self.on_request is not None:
            self.on_request(verb, resource)
        try:
            response = await self.http.request(
                method,
                path,
                params=params,
                content=yaml_safe_json(body) if body is not None else None,
                headers={
                    **({"Content-Type": content_type} if body is not None else {}),
                    **({"Accept": accept} if accept else {}),
                },
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
            return await self._request(
                "GET", res.path(namespace, name), verb="get", resource=res.plural
            )
        except NotFound:
            return None

    async def exists(self, res: Resource, namespace: str | None, name: str) -> bool:
        """Whether the object exists, read as its metadata only (PartialObjectMetadata): the
        operator learns that a Secret is there, never what it holds."""
        try:
            await self._request(
                "GET",
                res.path(namespace, name),
                verb="get",
                resource=res.plural,
                accept=METADATA_ONLY,
            )
        except NotFound:
            return False
        return True

    async def serves(self, res: Resource) -> bool:
        """Whether the API server serves `res` (discovery of its group version; 404: no)."""
        try:
            data = await self._request(
                "GET", res.path().rsplit("/", 1)[0], verb="get", resource="discovery"
            )
        except NotFound:
            return False
        return any(r.get("name") == res.plural for r in data.get("resources", []))

    async def list(
        self, res: Resource, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[Obj]:
        params = {}
        if labels:
            params["labelSelector"] = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        try:
            data = await self._request(
                "GET", res.path(namespace), verb="list", resource=res.plural, params=params
            )
        except NotFound:
            return []  # the type is not installed (e.g. ServiceMonitor without prometheus-operator)
        items: list[Obj] = data.get("items", [])
        for item in items:  # list responses omit these per item
            item.setdefault("apiVersion", res.api_version)
            item.setdefault("kind", res.kind)
        return items

    async def pod_warnings(self, namespace: str, pod: str) -> builtins.list[Obj]:
        """The Warning Events of one pod (a field-selected list: never cached)."""
        selector = f"involvedObject.kind=Pod,involvedObject.name={pod},type=Warning"
        data = await self._request(
            "GET",
            EVENT.path(namespace),
            verb="list",
            resource=EVENT.plural,
            params={"fieldSelector": selector},
        )
        items: builtins.list[Obj] = data.get("items", [])
        return items

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply with this client's field manager (force: the operator owns them)."""
        meta, res = obj["metadata"], resource_of(obj)
        return await self._request(
            "PATCH",
            res.path(meta.get("namespace"), meta["name"]),
            verb="patch",
            resource=res.plural,
            params={"fieldManager": self.field_manager, "force": "true"},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    async def create(self, obj: Obj) -> Obj:
        meta, res = obj["metadata"], resource_of(obj)
        return await self._request(
            "POST", res.path(meta.get("namespace")), verb="create", resource=res.plural, body=obj
        )

    async def dry_run_create(self, obj: Obj) -> None:
        """A create with `dryRun=All`: the API server validates and admits `obj` and stores
        nothing. It validates before it looks for a namesake, so `Conflict` (the name exists)
        means the object itself was accepted; `Invalid` carries the server's reasons."""
        meta, res = obj["metadata"], resource_of(obj)
        await self._request(
            "POST",
            res.path(meta.get("namespace")),
            verb="dryrun",
            resource=res.plural,
            # Strict: an undeclared field is an error, as it is for the operator's apply.
            params={
                "dryRun": "All",
                "fieldManager": self.field_manager,
                "fieldValidation": "Strict",
            },
            body=obj,
        )

    async def replace(self, obj: Obj) -> Obj:
        """PUT: the whole object, refused with Conflict when `metadata.resourceVersion` is stale
        (what a compare-and-swap such as a Lease takeover needs)."""
        meta, res = obj["metadata"], resource_of(obj)
        return await self._request(
            "PUT",
            res.path(meta.get("namespace"), meta["name"]),
            verb="update",
            resource=res.plural,
            body=obj,
        )

    async def merge_patch(self, res: Resource, namespace: str | None, name: str, patch: Obj) -> Obj:
        """A JSON merge patch (for objects the operator does not own by apply, e.g. Events)."""
        return await self._request(
            "PATCH",
            res.path(namespace, name),
            verb="patch",
            resource=res.plural,
            body=patch,
            content_type="application/merge-patch+json",
        )

    async def delete(self, res: Resource, namespace: str | None, name: str) -> bool:
        """Delete with background propagation; False when it was already gone."""
        try:
            await self._request(
                "DELETE",
                res.path(namespace, name),
                verb="delete",
                resource=res.plural,
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "propagationPolicy": "Background",
                },
            )
            return True
        except NotFound:
            return False

    async def apply_status(
        self,
        res: Resource,
        namespace: str,
        name: str,
        status: Obj,
        field_manager: str | None = None,
    ) -> Obj:
        """Server-side apply of `.status` (fields this manager no longer sets are removed);
        `field_manager`: another manager than the client's, owning only what it applies."""
        body = {
            "apiVersion": res.api_version,
            "kind": res.kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        return await self._request(
            "PATCH",
            res.path(namespace, name) + "/status",
            verb="patch",
            resource=f"{res.plural}/status",
            params={"fieldManager": field_manager or self.field_manager, "force": "true"},
            body=body,
            content_type="application/apply-patch+yaml",
        )


__all__ = [
    "ConfigurationCredentials",
    "Credentials",
    "KubeAuth",
    "KubeClient",
    "KubeError",
    "TokenFile",
    "load_configuration",
    "load_credentials",
]
