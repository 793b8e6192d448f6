"""ControlPlane: real etcd, kube-apiserver, controller-manager (+ scheduler, kwok) on loopback.

Usage::

    with ControlPlane(with_scheduler=True, with_kwok=True) as cp:
        api = cp.api_client()                    # kubernetes.client.ApiClient, admin rights
        cp.add_gpu_node("gpu-a", gpus=8, product="NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition")
        print(cp.kubeconfig_path, cp.server_url)

What ``start()`` does, in order: locate (or build) the binaries; make a temporary data dir;
generate a CA, the API server's serving cert, an admin client cert (``system:masters``) and
the service-account signing key pair; start etcd, then kube-apiserver (both on 127.0.0.1,
free ports) and wait for ``/readyz``; write ``<data dir>/kubeconfig``; install the CRDs
given as ``crds=[...]`` (see :meth:`ControlPlane.install_crds` for why before); start
kube-controller-manager (all default controllers: garbage collector, Deployment,
ReplicaSet, StatefulSet, service accounts, node lifecycle, ...) and wait until it has
created the ``default`` ServiceAccount; optionally start kube-scheduler and kwok (kwok
manages Nodes annotated ``kwok.x-k8s.io/node=fake``, which :meth:`add_gpu_node` creates)
and, with ``with_lws=True``, the LeaderWorkerSet controller with its webhooks (:mod:`.lws`;
its CRDs are installed with ``crds``).

``stop()`` (also run by ``__exit__``, by an ``atexit`` hook and on SIGTERM when nobody else
handles it) terminates the process groups newest first and deletes the data dir, unless
``keep_data_dir`` is set or ``DSV4_DEVCLUSTER_KEEP=1``, in which case the component logs
(``<data dir>/logs/*.log``) stay for inspection.
"""

from __future__ import annotations

import atexit
import base64
import os
import re
import shutil
import signal
import ssl
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import yaml

from dsv4_devcluster import binaries as _binaries
from dsv4_devcluster import kwok as _kwok
from dsv4_devcluster import lws as _lws
from dsv4_devcluster import nodes as _nodes
from dsv4_devcluster import pki as _pki
from dsv4_devcluster.process import ManagedProcess, free_port, wait_for

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
DATA_DIR_PREFIX = "dsv4-devcluster-"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
_REQUEST_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")

_RUNNING: set[ControlPlane] = set()
_RUNNING_LOCK = threading.Lock()


class DevClusterError(RuntimeError):
    """A component failed to start or become ready; the message carries its log tail."""


class ControlPlane:
    """A throwaway Kubernetes control plane; see the module docstring."""

    def __init__(
        self,
        *,
        with_scheduler: bool = False,
        with_kwok: bool = False,
        with_lws: bool = False,
        kwok_plays_pods: bool = True,
        binaries: _binaries.Binaries | None = None,
        keep_data_dir: bool | None = None,
        start_timeout: float = 180.0,
        extra_apiserver_args: Mapping[str, str] | None = None,
        extra_controller_manager_args: Mapping[str, str] | None = None,
        crds: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        self.with_scheduler = with_scheduler
        self.with_kwok = with_kwok
        self.with_lws = with_lws
        self.kwok_plays_pods = kwok_plays_pods  # False: something else runs the pods
        self._binaries = binaries
        if keep_data_dir is None:
            keep_data_dir = os.environ.get("DSV4_DEVCLUSTER_KEEP", "") not in ("", "0")
        self.keep_data_dir = keep_data_dir
        self.start_timeout = start_timeout
        self.extra_apiserver_args = dict(extra_apiserver_args or {})
        self.extra_controller_manager_args = dict(extra_controller_manager_args or {})
        self.crds = [Path(p) for p in crds]
        self._procs: list[ManagedProcess] = []
        self._data_dir: Path | None = None
        self._pki: _pki.Pki | None = None
        self._server_url: str | None = None
        self._prev_sigterm: Any = None
        self.startup_seconds: float | None = None

    # --- public surface ------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """Temporary directory with PKI, kubeconfig, etcd data and ``logs/``."""
        if self._data_dir is None:
            raise DevClusterError("control plane not started")
        return self._data_dir

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig (``system:masters`` client cert, CA embedded)."""
        return self.data_dir / "kubeconfig"

    @property
    def server_url(self) -> str:
        """``https://127.0.0.1:<port>`` of the API server."""
        if self._server_url is None:
            raise DevClusterError("control plane not started")
        return self._server_url

    @property
    def processes(self) -> list[ManagedProcess]:
        """The running components, in start order."""
        return list(self._procs)

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` with admin credentials (close it when done)."""
        from kubernetes import client

        pki = self._require_pki()
        cfg = client.Configuration()
        cfg.host = self.server_url
        cfg.ssl_ca_cert = str(pki.ca_cert)
        cfg.cert_file = str(pki.admin_cert)
        cfg.key_file = str(pki.admin_key)
        cfg.verify_ssl = True
        return client.ApiClient(cfg)

    def request_counts(self, succeeded_only: bool = False) -> dict[tuple[str, str], float]:
        """(verb, resource) -> requests the API server has answered so far, summed over the
        other labels of its own ``apiserver_request_total`` counter (``/metrics``);
        `succeeded_only`: those it answered with a 2xx code."""
        pki = self._require_pki()
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        with urllib.request.urlopen(f"{self.server_url}/metrics", context=ctx, timeout=10) as r:
            text = r.read().decode()
        out: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            match = _REQUEST_SAMPLE.match(line)
            if match is None:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            if succeeded_only and not labels.get("code", "").startswith("2"):
                continue
            key = (labels.get("verb", ""), labels.get("resource", ""))
            out[key] = out.get(key, 0.0) + float(match["value"])
        return out

    def dynamic_client(self) -> Any:
        """A ``kubernetes.dynamic.DynamicClient`` (dict in, dict out; discovery cached in the
        data dir). Prefer it for CRDs and patches: in kubernetes==37 the typed ``*Api``
        classes default PATCH to ``application/json-patch+json`` unless ``_content_type``
        is passed."""
        from kubernetes import dynamic

        cache = str(self.data_dir / "discovery-cache.json")
        return dynamic.DynamicClient(self.api_client(), cache_file=cache)  # type: ignore[no-untyped-call]

    def add_gpu_node(
        self,
        name: str,
        gpus: int,
        product: str,
        *,
        labels: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Register a kwok-managed Node with ``gpus`` x ``nvidia.com/gpu`` of ``product``.

        Waits until the node is Ready and carries no ``node.kubernetes.io/*`` taint, so the
        scheduler can place pods on it. Requires ``with_kwok=True`` (kwok keeps its lease
        and Ready condition fresh; without it the node lifecycle controller would mark it
        NotReady after the grace period).
        """
        if not self.with_kwok:
            raise DevClusterError("add_gpu_node needs ControlPlane(with_kwok=True)")
        dyn = self.dynamic_client()
        try:
            return _nodes.create_gpu_node(dyn, name, gpus, product, labels=labels, timeout=timeout)
        finally:
            dyn.client.close()

    def install_crds(self, paths: Sequence[str | os.PathLike[str]], timeout: float = 60.0) -> None:
        """Server-side apply every CRD in the YAML files ``paths``; wait until Established.

        CRDs passed as ``ControlPlane(crds=...)`` are installed before kube-controller-manager
        starts, so its garbage collector watches them from the beginning. A CRD installed
        later is picked up by the garbage collector's periodic discovery (about 30 s), so
        owner-reference cleanup of its objects starts only then.
        """
        dyn = self.dynamic_client()
        try:
            resource = dyn.resources.get(
                api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition"
            )
            names = []
            for path in paths:
                for doc in yaml.safe_load_all(Path(path).read_text()):
                    if not doc:
                        continue
                    name = doc["metadata"]["name"]
                    resource.server_side_apply(
                        body=doc, name=name, field_manager="dsv4-devcluster", force_conflicts=True
                    )
                    names.append(name)

            def established() -> bool:
                for name in names:
                    status = resource.get(name=name).to_dict().get("status", {})
                    ok = any(
                        c.get("type") == "Established" and c.get("status") == "True"
                        for c in status.get("conditions", [])
                    )
                    if not ok:
                        return False
                return True

            wait_for(f"CRDs {names} Established", established, timeout, interval=0.25)
        finally:
            dyn.client.close()

    def start(self) -> ControlPlane:
        """Start every component and wait until each is ready; idempotent per instance.

        Raises :class:`~.binaries.BinariesUnavailable` if the executables are neither
        present nor buildable, :class:`DevClusterError` (with the failing component's log
        tail) if a component does not come up; everything started so far is stopped.
        """
        if self._procs:
            return self
        t0 = time.monotonic()
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        self._install_sigterm_handler()
        try:
            self._start()
        except _binaries.BinariesUnavailable:
            self.stop()
            raise
        except Exception as exc:
            self.stop()
            raise DevClusterError(f"dev control plane failed to start: {exc}") from exc
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Terminate the components (newest first) and remove the data dir; safe to repeat."""
        try:
            for proc in reversed(self._procs):
                proc.stop()
            self._procs.clear()
            if self._data_dir is not None:
                if self.keep_data_dir:
                    (self._data_dir / "owner.pid").unlink(missing_ok=True)
                else:
                    shutil.rmtree(self._data_dir, ignore_errors=True)
        finally:
            self._restore_sigterm_handler()
            with _RUNNING_LOCK:
                _RUNNING.discard(self)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM, as an upgrade or a node drain would); the other
        components keep running and retry until :meth:`start_apiserver`."""
        self._apiserver().stop()

    def start_apiserver(self, timeout: float = 120.0) -> None:
        """Start kube-apiserver again with the same flags, port and data; wait for /readyz."""
        old = self._apiserver()
        if old.alive():
            raise DevClusterError("kube-apiserver is running; stop it first")
        new = ManagedProcess(old.name, old.argv, old.log_path, old.env)
        self._procs[self._procs.index(old)] = new
        self._wait_apiserver_ready(new, timeout)

    def restart_exited(self) -> list[str]:
        """Start again, with the same flags, every component that has exited, the way a
        kubelet restarts a crashed static pod (kube-scheduler exits on purpose when its cache
        disagrees with the API server, which an API server restart can cause). Returns the
        names of the components restarted."""
        restarted = []
        for index, proc in enumerate(self._procs):
            if not proc.alive():
                proc.stop()  # reap it
                self._procs[index] = ManagedProcess(proc.name, proc.argv, proc.log_path, proc.env)
                restarted.append(proc.name)
        return restarted

    def component(self, name: str) -> ManagedProcess:
        """The running component `name` (`kube-apiserver`, `etcd`, ...)."""
        found = next((p for p in self._procs if p.name == name), None)
        if found is None:
            raise DevClusterError(f"control plane not started (no {name})")
        return found

    def _apiserver(self) -> ManagedProcess:
        return self.component("kube-apiserver")

    # --- start-up ------------------------------------------------------------------------

    def _start(self) -> None:
        """Start the components in dependency order, each waited for before the next."""
        bins = self._locate_binaries()
        self._make_data_dir()
        deadline = time.monotonic() + self.start_timeout

        def remaining() -> float:
            return max(5.0, deadline - time.monotonic())

        etcd_url = self._start_etcd(bins, remaining)
        self._start_apiserver(bins, etcd_url, remaining)
        self._write_kubeconfig()
        crds = self.crds + (_lws.crd_paths(bins) if self.with_lws else [])
        if crds:
            self.install_crds(crds, timeout=remaining())
        self._start_controller_manager(bins, remaining)
        if self.with_scheduler:
            self._start_kube_component(bins, "kube-scheduler", [], remaining)
        if self.with_kwok:
            self._start_kwok(bins, remaining)
        if self.with_lws:
            _lws.start(
                bins,
                self._require_pki(),
                self.data_dir,
                self.kubeconfig_path,
                lambda name, argv, env: self._spawn(name, argv, {**os.environ, **env}),
                self.dynamic_client,
                remaining(),
            )

    def _locate_binaries(self) -> _binaries.Binaries:
        needed: tuple[str, ...] = _binaries.CONTROL_PLANE_BINARIES
        if self.with_scheduler:
            needed += ("kube-scheduler",)
        if self.with_kwok:
            needed += ("kwok",)
        if self.with_lws:
            needed += _binaries.LWS_BINARIES
        bins = self._binaries or _binaries.locate(needed)
        bins.require(needed)
        return bins

    def _make_data_dir(self) -> None:
        """A fresh data dir (stale ones of dead owners swept first), its logs/ and the PKI."""
        _sweep_stale_data_dirs()
        self._data_dir = Path(tempfile.mkdtemp(prefix=DATA_DIR_PREFIX))
        (self._data_dir / "owner.pid").write_text(str(os.getpid()))
        (self._data_dir / "logs").mkdir()
        self._pki = _pki.generate(self._data_dir / "pki")

    def _start_etcd(self, bins: _binaries.Binaries, remaining: Callable[[], float]) -> str:
        """Start etcd and wait for /health; returns its client URL."""
        client, peer = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        etcd = self._spawn(
            "etcd",
            [
                str(bins.path("etcd")),
                "--name=devcluster",
                f"--data-dir={self.data_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=devcluster={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",  # throwaway data: skip fsync, much faster on shared disks
                "--log-level=warn",
            ],
        )
        wait_for(
            "etcd /health",
            lambda: b'"health":"true"' in _http_get(f"{client_url}/health"),
            remaining(),
            process=etcd,
        )
        return client_url

    def _start_apiserver(
        self, bins: _binaries.Binaries, etcd_url: str, remaining: Callable[[], float]
    ) -> None:
        """Start kube-apiserver on a free loopback port and wait for /readyz."""
        pki = self._require_pki()
        api_port = free_port()
        self._server_url = f"https://127.0.0.1:{api_port}"
        api_args = {
            "etcd-servers": etcd_url,
            "bind-address": "127.0.0.1",
            "advertise-address": "127.0.0.1",
            # The endpoint reconciler refuses a loopback advertise address; nothing in-cluster
            # needs the `kubernetes` Service endpoints here.
            "endpoint-reconciler-type": "none",
            # No kube-proxy here: the API server calls a webhook Service (and an aggregated
            # API) at one of its ready endpoints (EndpointSlices) instead of the ClusterIP.
            "enable-aggregator-routing": "true",
            "secure-port": str(api_port),
            "cert-dir": str(self.data_dir / "apiserver"),
            "tls-cert-file": str(pki.serving_cert),
            "tls-private-key-file": str(pki.serving_key),
            "client-ca-file": str(pki.ca_cert),
            "service-account-issuer": SERVICE_ACCOUNT_ISSUER,
            "service-account-key-file": str(pki.sa_pub),
            "service-account-signing-key-file": str(pki.sa_key),
            "service-cluster-ip-range": SERVICE_CLUSTER_IP_RANGE,
            "authorization-mode": "RBAC",
            "allow-privileged": "true",
        }
        api_args.update(self.extra_apiserver_args)
        argv = [str(bins.path("kube-apiserver")), *(f"--{k}={v}" for k, v in api_args.items())]
        self._wait_apiserver_ready(self._spawn("kube-apiserver", argv), remaining())

    def _wait_apiserver_ready(self, apiserver: ManagedProcess, timeout: float) -> None:
        ctx = self._client_ssl_context()
        wait_for(
            "kube-apiserver /readyz",
            lambda: _http_get(f"{self.server_url}/readyz", ctx) == b"ok",
            timeout,
            interval=0.5,
            process=apiserver,
        )

    def _start_controller_manager(
        self, bins: _binaries.Binaries, remaining: Callable[[], float]
    ) -> None:
        """Start kube-controller-manager; ready once it has made the default ServiceAccount."""
        pki = self._require_pki()
        kcm = self._start_kube_component(
            bins,
            "kube-controller-manager",
            [
                "--controllers=*",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                "--use-service-account-credentials=false",
                "--cluster-name=dsv4-devcluster",
                *(f"--{k}={v}" for k, v in self.extra_controller_manager_args.items()),
            ],
            remaining,
        )
        ctx = self._client_ssl_context()
        wait_for(
            "the default ServiceAccount (created by kube-controller-manager)",
            lambda: _http_get(
                f"{self.server_url}/api/v1/namespaces/default/serviceaccounts/default", ctx
            ),
            remaining(),
            interval=0.5,
            process=kcm,
        )

    def _start_kube_component(
        self,
        bins: _binaries.Binaries,
        name: str,
        extra_args: Sequence[str],
        remaining: Callable[[], float],
    ) -> ManagedProcess:
        """kube-controller-manager or kube-scheduler: admin kubeconfig, no leader election,
        serving on a free loopback port; waited for on /healthz."""
        port = free_port()
        proc = self._spawn(
            name,
            [
                str(bins.path(name)),
                f"--kubeconfig={self.kubeconfig_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.data_dir / name}",
                "--leader-elect=false",
                *extra_args,
            ],
        )
        insecure = _insecure_ssl_context()  # components serve self-signed certs on loopback
        wait_for(
            f"{name} /healthz",
            lambda: _http_get(f"https://127.0.0.1:{port}/healthz", insecure) == b"ok",
            remaining(),
            interval=0.5,
            process=proc,
        )
        return proc

    def _start_kwok(self, bins: _binaries.Binaries, remaining: Callable[[], float]) -> None:
        """Start kwok (it plays the kubelet of the fake GPU nodes) and wait for /healthz."""
        port = free_port()
        config = self.data_dir / "kwok.yaml"
        config.write_text(_kwok.config_yaml(f"127.0.0.1:{port}", self.kwok_plays_pods))
        kwok = self._spawn(
            "kwok",
            [str(bins.path("kwok")), f"--config={config}", f"--kubeconfig={self.kubeconfig_path}"],
            env={**os.environ, "HOME": str(self.data_dir)},
        )
        wait_for(
            "kwok /healthz",
            lambda: _http_get(f"http://127.0.0.1:{port}/healthz") == b"ok",
            remaining(),
            interval=0.5,
            process=kwok,
        )

    def _spawn(
        self, name: str, argv: list[str], env: Mapping[str, str] | None = None
    ) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.data_dir / "logs" / f"{name}.log", env=env)
        self._procs.append(proc)
        return proc

    def _require_pki(self) -> _pki.Pki:
        if self._pki is None:
            raise DevClusterError("control plane not started")
        return self._pki

    def _client_ssl_context(self) -> ssl.SSLContext:
        pki = self._require_pki()
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        return ctx

    def _write_kubeconfig(self) -> None:
        pki = self._require_pki()

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "dsv4-devcluster",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": b64(pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "dsv4-admin",
                    "user": {
                        "client-certificate-data": b64(pki.admin_cert),
                        "client-key-data": b64(pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "dsv4-devcluster",
                    "context": {"cluster": "dsv4-devcluster", "user": "dsv4-admin"},
                }
            ],
            "current-context": "dsv4-devcluster",
            "preferences": {},
        }
        self.kubeconfig_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig_path.chmod(0o600)

    # --- signals -------------------------------------------------------------------------

    def _install_sigterm_handler(self) -> None:
        """Turn SIGTERM into KeyboardInterrupt (so cleanup runs) if nobody else handles it."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            self._prev_sigterm = signal.SIG_DFL
            signal.signal(signal.SIGTERM, _sigterm_to_exit)

    def _restore_sigterm_handler(self) -> None:
        if self._prev_sigterm is None:
            return
        if (
            threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is _sigterm_to_exit
        ):
            signal.signal(signal.SIGTERM, self._prev_sigterm)
        self._prev_sigterm = None


def _sigterm_to_exit(signum: int, frame: FrameType | None) -> None:
    # KeyboardInterrupt, not SystemExit: pytest would record SystemExit as one failed test
    # and carry on, while it stops the session (tearing fixtures down) on KeyboardInterrupt.
    raise KeyboardInterrupt(f"signal {signum}")


def _sweep_stale_data_dirs() -> None:
    """Remove data dirs left by a harness process that was SIGKILLed (its owner is gone).

    Its children died with it (``PR_SET_PDEATHSIG``); only the directory can remain.
    Directories kept on purpose (``keep_data_dir``) carry no ``owner.pid`` after stop.
    """
    for path in Path(tempfile.gettempdir()).glob(f"{DATA_DIR_PREFIX}*"):
        try:
            pid = int((path / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if not _pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _http_get(url: str, ctx: ssl.SSLContext | None = None) -> bytes:
    with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
        body: bytes = resp.read()
        return body.strip()


def _insecure_ssl_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _stop_running() -> None:
    with _RUNNING_LOCK:
        running = list(_RUNNING)
    for cp in running:
        cp.stop()


# Registered after process.stop_all (imported above), so it runs before it at exit.
atexit.register(_stop_running)
