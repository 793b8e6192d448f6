"""The playground: the dev control plane plus a process runtime, where the README's install
path runs as written (``make playground``; ``with Playground() as pg:`` in tests).

What it starts, and what is real:

* REAL: etcd, kube-apiserver, kube-controller-manager, kube-scheduler (:mod:`.controlplane`);
  helm and kubectl (the pinned dev tools, put on ``PATH`` by the printed shell line);
* kwok keeps the fake GPU nodes (Ready, leases) and removes deleted pods; it runs no pod here;
* the pod runner (:mod:`.playground_runner`) runs every pod bound to a node whose image it
  knows as host processes in a network namespace of its own (a veth pair and an address, as a
  CNI plugin gives a pod its IP; nothing is added to the host's interfaces): the operator's
  replicas as the chart installs them (webhook, leader election), the weights download Job,
  the tap and `helm test`'s pod (REAL: this tree's ``dsv4``), the router (REAL:
  ``sglang-router`` from PyPI, the rendered argv), and the engines (STAND-IN: the engine test
  double, in the SGLang release the StatefulSet names; there is no GPU);
* a default StorageClass ``playground-local`` with a provisioner making hostPath volumes
  under the playground's directory (:mod:`.playground_storage`);
* the stand-in Hub (:mod:`.playground_hub`, a command): small repos under the model names;
  every pod's ``HF_ENDPOINT`` points at it (STAND-IN for the Hugging Face Hub).

Services: each pod's namespace holds every ClusterIP on its own ``lo`` with a relay to the
ready endpoints (:mod:`.playground_services`, kube-proxy's userspace mode); names resolve
through the pod's /etc/hosts (``<service>.<ns>.svc``, ``<pod>.<service>.<ns>.svc``). Not
there: cluster DNS itself, container images (any tag of a known image runs this tree's code),
``kubectl logs`` (each container's log is a file under the playground's ``pods/`` directory).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from dsv4_devcluster.controlplane import ControlPlane
from dsv4_devcluster.netns import PodNetwork
from dsv4_devcluster.playground_runner import PodRunner
from dsv4_devcluster.playground_storage import STORAGE_CLASS, LocalProvisioner
from dsv4_devcluster.process import free_port, stop_on_signals

REPO = Path(__file__).resolve().parents[2]
RTX = "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
DEFAULT_NODES = (("gpu-rtxpro-0", 8, RTX), ("gpu-rtxpro-1", 8, RTX))
# Listed by `Playground.diagnosis`.
RESOURCES_SHOWN = (
    ("v1", "Pod"),
    ("v1", "PersistentVolumeClaim"),
    ("batch/v1", "Job"),
    ("dsv4.io/v1alpha1", "DSV4Model"),
    ("dsv4.io/v1alpha1", "DSV4Deployment"),
)

PARTS = (
    ("real", "etcd, kube-apiserver, kube-controller-manager, kube-scheduler"),
    ("real", "helm, kubectl (pinned dev tools)"),
    ("real", "the operator's pods (dsv4 run: webhook, leader election), the weights Job, the"
             " tap, helm test's pod: this tree's dsv4, in pod network namespaces"),
    ("real", "the router: sglang-router from PyPI, the argv the operator renders"),
    ("real", f"StorageClass {STORAGE_CLASS} (default): hostPath volumes made per claim"),
    ("stand-in", "the engines: the engine test double, in the SGLang release the spec names"),
    ("stand-in", "the Hugging Face Hub: small repos under the model names (HF_ENDPOINT)"),
    ("stand-in", "GPU nodes: kwok keeps them; Services relayed in each pod, names in /etc/hosts"),
)  # fmt: skip


def devtools() -> ModuleType:
    """tools/devtools.py, which fetches the pinned helm, kubectl, promtool and prometheus."""
    spec = importlib.util.spec_from_file_location("devtools", REPO / "tools" / "devtools.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"no {REPO / 'tools' / 'devtools.py'}: run from a clone")
    module = importlib.util.module_from_spec(spec)
    sys.modules["devtools"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def tool_dirs() -> list[Path]:
    """The directories of the pinned helm and kubectl (fetched on first use)."""
    tools = devtools()
    return [Path(tools.helm().path).parent, Path(tools.kubectl().path).parent]


class Playground:
    """The control plane, nodes, Hub, storage and pod runner; see the module docstring."""

    def __init__(
        self,
        nodes: Sequence[tuple[str, int, str]] = DEFAULT_NODES,
        say: Callable[[str], None] | None = None,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.nodes = list(nodes)
        # Added to every pod's environment (the engine double's DSV4_DOUBLE_* knobs, say).
        self.extra_env = dict(extra_env or {})
        self.say = say or (lambda line: None)
        self.cp = ControlPlane(with_scheduler=True, with_kwok=True, kwok_plays_pods=False)
        self.root = Path(tempfile.mkdtemp(prefix="dsv4-playground-"))
        self.hub_endpoint = ""
        self.hub_lines: list[str] = []
        self._hub: subprocess.Popen[str] | None = None
        self.network: PodNetwork | None = None
        self.runner: PodRunner | None = None
        self.provisioner: LocalProvisioner | None = None
        self.started_seconds = 0.0

    def start(self) -> Playground:
        started = time.monotonic()
        self.say("starting the control plane (the first run builds the binaries: minutes)")
        self.cp.start()
        for name, gpus, product in self.nodes:
            self.cp.add_gpu_node(name, gpus, product)
            self.say(f"node {name}: {gpus} x nvidia.com/gpu ({product}), kept by kwok")
        self._start_hub()
        self.provisioner = LocalProvisioner(self.cp.dynamic_client(), self.root / "volumes")
        self.provisioner.start()
        self.network = PodNetwork().__enter__()
        api_port = int(self.cp.server_url.rsplit(":", 1)[1])
        hub_port = int(self.hub_endpoint.rsplit(":", 1)[1])
        self.runner = PodRunner(
            self.cp,
            self.network,
            self.root,
            relay_ports=(api_port, hub_port),
            extra_env={**self.extra_env, "HF_ENDPOINT": self.hub_endpoint},
        )
        self.runner.on_event = self.say
        self.runner.start()
        self.started_seconds = time.monotonic() - started
        return self

    def _start_hub(self) -> None:
        port = free_port()
        argv = [sys.executable, "-m", "dsv4_devcluster.playground_hub", "--port", str(port)]
        self._hub = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self._hub.stdout is not None
        for line in self._hub.stdout:
            line = line.rstrip()
            if line == "serving":
                break
            self.hub_lines.append(line)
            if line.startswith("endpoint "):
                self.hub_endpoint = line.split(" ", 1)[1]
        if not self.hub_endpoint:
            raise RuntimeError(f"the stand-in Hub did not start: {self.hub_lines}")
        self.say(f"stand-in Hub `{' '.join(argv[1:])}` at {self.hub_endpoint}:")
        for line in self.hub_lines[1:]:
            self.say(f"  {line}")

    def env(self) -> dict[str, str]:
        """What a shell needs to drive the playground: KUBECONFIG, PATH (helm, kubectl, dsv4)
        and a HOME of its own: without one kubectl and helm keep their caches in the working
        directory (a checkout's `.kube/cache`)."""
        dirs = [*tool_dirs(), Path(sys.executable).parent]
        path = os.pathsep.join([*map(str, dirs), os.environ.get("PATH", "")])
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        return {"KUBECONFIG": str(self.cp.kubeconfig_path), "PATH": path, "HOME": str(home)}

    def shell_line(self) -> str:
        dirs = os.pathsep.join(str(d) for d in [*tool_dirs(), Path(sys.executable).parent])
        kubeconfig = shlex.quote(str(self.cp.kubeconfig_path))
        return f'export KUBECONFIG={kubeconfig} PATH={shlex.quote(dirs)}:"$PATH"'

    def diagnosis(self, log_lines: int = 25) -> list[str]:
        """What a failed step needs to be told apart: the runner's errors and refusals, every
        pod, claim, Job, DSV4Model and DSV4Deployment with its phase, the newest events, each
        operator pod's metrics that say what it watches and does, and the tail of each
        container's log (there is no `kubectl logs` here)."""
        lines = [f"runner error: {e}" for e in (self.runner.errors if self.runner else [])]
        lines += [f"runner cannot run {k}: {why}" for k, why in
                  sorted((self.runner.unrunnable if self.runner else {}).items())]  # fmt: skip
        try:
            dyn = self.cp.dynamic_client()
        except Exception as error:  # the diagnosis must not hide the failure it explains
            lines.append(f"cannot reach the API server: {type(error).__name__}: {error}")
        else:
            try:
                for what in (*RESOURCES_SHOWN, ("v1", "Event")):
                    try:
                        lines += _listed(dyn, *what)
                    except Exception as error:
                        lines.append(f"cannot list {what[1]}: {type(error).__name__}: {error}")
            finally:
                dyn.client.close()
        lines += self._operator_metrics()
        for log in sorted((self.root / "pods").glob("*/*.log")):
            # Probes' access lines (every 5 s) would push out what the log has to say.
            said = [line for line in log.read_text(errors="replace").splitlines()
                    if "GET /healthz" not in line and "GET /readyz" not in line]  # fmt: skip
            tail = said[-log_lines:]
            lines += [f"--- {log.parent.name}/{log.name} (last {len(tail)} lines)", *tail]
        return lines

    def _operator_metrics(self) -> list[str]:
        """Each operator pod's leadership, passes, watch lists and errors and discovery reads,
        read from its metrics port inside its network (which kinds it watches, whether it
        leads and reconciles)."""
        if self.runner is None:
            return []
        families = ("dsv4_leader ", "dsv4_reconciles_total", "dsv4_watch_lists_total",
                    "dsv4_watch_errors_total")  # fmt: skip
        discovery = 'resource="discovery"'  # the reads that look for kinds not installed
        url = "http://127.0.0.1:8080/metrics"  # the chart's ports.metrics
        read = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=5).read().decode())"
        lines = []
        for where in sorted(self.runner.kinds()):
            namespace, pod, container = where.split("/")
            if container != "operator":
                continue
            try:
                argv = self.runner.command_in_pod(namespace, pod, [sys.executable, "-c", read])
                done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            except Exception as error:  # gone since, or not answering: say so, go on
                lines.append(f"--- {pod} metrics: {type(error).__name__}: {error}")
                continue
            said = done.stdout.splitlines()
            found = [m for m in said if m.startswith(families) or discovery in m]
            lines.append(f"--- {pod} metrics: " + ("; ".join(found) or done.stderr[-300:]))
        return lines

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        if self.provisioner is not None:
            self.provisioner.stop()
        if self.network is not None:
            self.network.close()
        if self._hub is not None:
            self._hub.terminate()
            self._hub.wait(10)
        self.cp.stop()
        subprocess.run(["rm", "-rf", str(self.root)], check=False)

    def __enter__(self) -> Playground:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listed(dyn: Any, api_version: str, kind: str) -> list[str]:
    """A line per object of `kind`: its phase, node and conditions not True; for events,
    the newest 20."""
    items = dyn.resources.get(api_version=api_version, kind=kind)
    found = items.get().items
    if kind == "Event":
        newest = sorted(found, key=lambda e: str(e.lastTimestamp or e.eventTime))[-20:]
        return [
            f"event {e.lastTimestamp or e.eventTime} {e.type} {e.involvedObject.kind}/"
            f"{e.involvedObject.name}: {e.reason}: {str(e.message)[:200]}"
            for e in newest
        ]
    lines = []
    for item in found:
        status = item.get("status") or {}
        unmet = [
            f"{c.get('type')}={c.get('status')} ({c.get('reason')}: "
            f"{str(c.get('message', ''))[:160]})"
            for c in status.get("conditions") or []
            if c.get("status") != "True"
        ]
        node = (item.get("spec") or {}).get("nodeName")
        lines.append(
            f"{kind} {item.metadata.namespace}/{item.metadata.name}: phase "
            f"{status.get('phase')}"
            + (f", node {node}" if node else "")
            + "".join(f"; {u}" for u in unmet)
        )
    return lines


def describe_parts() -> list[str]:
    return [f"  {kind:9} {what}" for kind, what in PARTS]


def status_lines(runner: Any) -> list[str]:
    """The pods running and what runs each container; the pods the runner cannot run."""
    lines = [f"  {where}: {kind}" for where, kind in sorted(runner.kinds().items())]
    lines += [f"  cannot run {key}: {why}" for key, why in sorted(runner.unrunnable.items())]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m dsv4_devcluster.playground`` (``make playground``): run until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dsv4_devcluster.playground",
        description="Start the playground (a local cluster whose pods really run, the engine a "
        "stand-in), print the shell line that drives it, run until Ctrl-C; then remove it all.",
    )
    parser.parse_args(argv)
    stop = stop_on_signals()
    began = time.monotonic()

    def say(line: str) -> None:
        print(f"[playground {time.monotonic() - began:5.1f}s] {line}", flush=True)

    with Playground(say=say) as playground:
        print("What runs here:", *describe_parts(), sep="\n")
        print(f"Ready in {time.monotonic() - began:.1f}s. In another shell, from this directory:")
        print(f"  {playground.shell_line()}", flush=True)
        print("then the README's install section as written. Ctrl-C here removes it all.")
        reported = 0
        while not stop.wait(1.0):
            assert playground.runner is not None
            for error in playground.runner.errors[reported:]:  # retried on the next round
                say(f"pod runner: {error}")
            reported = len(playground.runner.errors)
            dead = [p.name for p in playground.cp.processes if not p.alive()]
            if dead:
                say(f"component(s) exited: {', '.join(dead)}")
                return 1
    print("stopped: control plane, pods, network namespaces and volumes removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
