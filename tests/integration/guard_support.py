"""End-to-end guard helpers: run the engine double the way a kubelet would.

`EngineKubelet` watches the decode StatefulSet that the operator renders and (re)starts the
engine double (testsupport/dsv4_engine_double, a test double for SGLang: there is no GPU here)
with that StatefulSet's argv and env whenever the template changes, so a rollout or a rollback
really changes what answers the canary.

The incident's corruption only shows under load. Instead of keeping real requests in flight (whose
overlap at the double follows the machine's speed), the kubelet DECLARES the load the engine
is serving: `DSV4_DOUBLE_LOAD=ENGINE_LOAD`, the incident's 60 concurrent sessions. Every canary
response is then judged at that load, on an idle laptop and a saturated CI runner alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx

from dsv4_devcluster import wait_for
from dsv4_devcluster.deployments import Cluster
from dsv4_devcluster.fleet import replace_flag
from dsv4_devcluster.operator import OperatorProcess
from dsv4_devcluster.process import free_port
from dsv4_operator.canary.scenario import CANARY_TOOLS

ENTRYPOINT_LENGTH = 3  # python3 -m sglang.launch_server
# The load every engine double here serves at (testsupport/dsv4_engine_double/config.py): the
# incident's 60 concurrent sessions, where bf16 + HiCache corrupts 4.55% of responses and fp8 none.
ENGINE_LOAD = 60


def double_env(container: dict[str, Any], stored: dict[str, Any]) -> dict[str, str]:
    """An engine container's env, and what the double reads of the image (its capabilities
    and release) from the stored revision `stored` (a ControllerRevision) of its spec."""
    engine = stored["data"]["spec"]["engine"]
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    env["DSV4_DOUBLE_CAPABILITIES"] = ",".join(engine.get("capabilities", []))
    env["DSV4_DOUBLE_SGLANG_VERSION"] = engine["sglangVersion"]
    return env


def base_env() -> dict[str, str]:
    """This process's env without engine or double knobs: the StatefulSet's env decides."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "DSV4_DOUBLE_"))}


def _hicache_flags(command: list[str]) -> list[str]:
    """`--enable-hierarchical-cache` and the `--hicache-*` flags (with values) of a command."""
    out: list[str] = []
    for i, arg in enumerate(command):
        if arg == "--enable-hierarchical-cache":
            out.append(arg)
        elif arg.startswith("--hicache-") and i + 1 < len(command):
            out += [arg, command[i + 1]]
    return out


def with_pair_hicache(decode: list[str], prefill: list[str]) -> list[str]:
    """The decode command, plus the prefill's HiCache flags if only the prefill has HiCache.

    The one double stands in for the prefill/decode pair behind the canary's endpoint, so it
    gets the pair's HiCache: the renderer may put HiCache on prefill only (PD decode disables
    the radix cache HiCache extends), and the incident's race follows HiCache wherever it runs."""
    if "--enable-hierarchical-cache" in decode:
        return decode
    return [*decode, *_hicache_flags(prefill)]


class EngineKubelet:
    """Runs the double for `x-decode` on 127.0.0.1:`port`; restarts it on template changes."""

    def __init__(self, cluster: Cluster, port: int, log_dir: Path, name: str = "dsv4-flash"):
        self.cluster, self.port, self.log_dir, self.name = cluster, port, log_dir, name
        self.proc: subprocess.Popen[bytes] | None = None
        self.running: tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None = None
        self.starts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> EngineKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._kill()

    @property
    def serving(self) -> bool:
        """Its watch runs (not stopped) and the double it started is up."""
        return (
            self._thread.is_alive()
            and not self._stop.is_set()
            and self.proc is not None
            and self.proc.poll() is None
        )

    def wait_answering(self, arguments: str, timeout: float = 60) -> None:
        """Until the double runs with `arguments` in its command line (space-joined) and
        answers /health: a kubelet restarts an engine after its revision changed, so the new
        one answers a moment after the deployment reports the revision served (kwok marks pods
        Ready at once)."""

        def answering() -> bool:
            line = " ".join(self.running[0]) if self.running else ""
            if not self.serving or arguments not in line:
                return False
            try:
                return httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).is_success
            except httpx.HTTPError:
                return False

        wait_for(f"the engine double with {arguments} answering", answering, timeout=timeout)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.running[1]) if self.running else {}

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def _desired(self) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]] | None:
        children = self.cluster.children(self.name)
        template = engine_template(children, self.name, "decode")
        if template is None:
            return None
        container = template["spec"]["containers"][0]
        revision = template["metadata"]["labels"]["dsv4.io/revision"]
        prefill_command = paired_prefill_command(children, self.name, revision)
        if prefill_command is None:
            return None  # the pair is mid-rollout: serve nothing rather than half of it
        stored = next(
            (
                r
                for r in self.cluster.revisions(self.name)
                if r["metadata"]["labels"]["dsv4.io/revision"] == revision
            ),
            None,
        )
        if stored is None:
            return None
        env = double_env(container, stored)
        env["DSV4_DOUBLE_LOAD"] = str(ENGINE_LOAD)
        # No effect on verdicts; keeps canary runs short (unless the spec's env sets it).
        env.setdefault("DSV4_DOUBLE_LATENCY_MS", "20")
        command = with_pair_hicache(list(container["command"]), prefill_command)
        # What a kubelet does with `$(VAR)` in a command; a group's leader is this process.
        known = {**group_env(children, self.name, "decode"), **env}
        command = [VAR.sub(lambda m: known.get(m[1], m[0]), arg) for arg in command]
        return tuple(command), tuple(sorted(env.items()))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                desired = self._desired()
            except Exception:  # the API server is busy; look again
                desired = self.running
            if desired != self.running or (desired and self.proc and self.proc.poll() is not None):
                self._kill()
                if desired is not None:
                    self._launch(desired)
                self.running = desired
            time.sleep(0.3)

    def _launch(self, desired: tuple[tuple[str, ...], tuple[tuple[str, str], ...]]) -> None:
        command, env = desired
        args = list(command[ENTRYPOINT_LENGTH:])
        args = replace_flag(args, "--host", "127.0.0.1")
        args = replace_flag(args, "--port", str(self.port))
        log = (self.log_dir / f"engine-double-{self.starts}.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4_engine_double", *args],
            env={**base_env(), **dict(env)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.starts += 1


Children = dict[tuple[str, str], dict[str, Any]]
# A Kubernetes variable reference in a container command.
VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def engine_template(children: Children, name: str, role: str) -> dict[str, Any] | None:
    """The engine pod template of a role of the main pair: its StatefulSet's, or for a
    multi-node role its LeaderWorkerSet's leader's (the leader alone serves HTTP)."""
    sts = children.get(("StatefulSet", f"{name}-{role}"))
    if sts is not None:
        template: dict[str, Any] = sts["spec"]["template"]
        return template
    lws = children.get(("LeaderWorkerSet", f"{name}-{role}"))
    if lws is not None:
        leader: dict[str, Any] = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        return leader
    return None


def group_env(children: Children, name: str, role: str) -> dict[str, str]:
    """The environment the LWS webhook gives a group's leader, this machine standing in for
    it (empty for a single-node role)."""
    lws = children.get(("LeaderWorkerSet", f"{name}-{role}"))
    if lws is None:
        return {}
    size = str(lws["spec"]["leaderWorkerTemplate"].get("size", 1))
    return {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": size, "LWS_WORKER_INDEX": "0"}


def paired_prefill_command(children: Children, name: str, revision: str) -> list[str] | None:
    """The prefill engines' command when they run `revision` too, else None (a Recreate
    deletes both roles and creates both anew: the decode double waits for its pair)."""
    template = engine_template(children, name, "prefill")
    if template is None:
        return None
    if template["metadata"]["labels"]["dsv4.io/revision"] != revision:
        return None
    return list(template["spec"]["containers"][0]["command"])


@contextlib.contextmanager
def tap_process(
    upstream: str,
    ports: dict[str, int],
    log_dir: Path,
    namespace: str,
    deployment: str = "dsv4-flash",
) -> Iterator[Popen[bytes]]:
    """`dsv4 tap` with the arguments the operator renders for the router pod's sidecar (kwok
    runs no container), in front of `upstream`, on `ports["tap"]` with its metrics on
    `ports["tap_metrics"]`; stopped on exit."""
    log = (log_dir / "tap.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "dsv4_operator.cli", "tap",
            "--upstream", upstream,
            "--listen", f"127.0.0.1:{ports['tap']}",
            "--metrics", f"127.0.0.1:{ports['tap_metrics']}",
            "--deployment", deployment, "--namespace", namespace,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # Listening before the test sends through it: on a loaded machine the tap's start
        # (imports, its classifier process) can outlast the deployment's way to Ready.
        wait_for(
            "the tap to listen",
            lambda: _listening(ports["tap"], proc, log_dir / "tap.log"),
            timeout=120,
        )
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def _listening(port: int, proc: Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"the tap exited ({proc.returncode}): {log.read_text()[-2000:]}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


# The incident's leaking configuration: bf16 index-K + HiCache (a transfer-format change too),
# admitted under safety policy Warn; the double corrupts responses under it at ENGINE_LOAD.
LEAKING = {
    "engine.indexKDtype": "bf16",
    "engine.hicache": {"enabled": True},
    "engine.capabilities": ["bf16IndexK", "poolSizingFix"],
    "safety.policy": "Warn",
}


def wait_good_revision_served(cluster: Cluster, engine: EngineKubelet, good: str) -> None:
    """Until the rollback is carried out: `good` is current again and the engine double runs
    its configuration (fp8 index-K, not the leaking bf16)."""
    wait_for(
        "the last known good revision served again",
        lambda: (
            cluster.get()["status"].get("currentRevision") == good
            and engine.env.get("SGLANG_DSV4_BF16_INDEX_K") == "0"
        ),
        timeout=180,
    )


def tool_calling_request(conversation: str | None = None) -> dict[str, object]:
    """A tool-calling chat request; by default each a new conversation (the double draws its
    answer from the conversation)."""
    return {
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": f"Plan trip {conversation or uuid.uuid4()}"}],
        "tools": CANARY_TOOLS,
    }


class Traffic:
    """Tool-calling requests (`tool_choice` unset: "auto", the OpenAI default) through the tap
    from 4 clients, until stopped; each a new conversation (the double draws its answer from the
    conversation). With a `seed` the conversations are the seed's sequence, else random; with a
    `rate` the clients together start at most that many requests a second, else as fast as they
    are answered."""

    CLIENTS = 4

    def __init__(self, url: str, seed: int | None = None, rate: float | None = None) -> None:
        self.url, self.sent, self.failed = url, 0, 0
        self._gap = self.CLIENTS / rate if rate else 0.0  # seconds between one client's starts
        self._next = itertools.count()
        self._run_id = str(uuid.uuid4()) if seed is None else f"seed-{seed}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _client(self, client: httpx.AsyncClient) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            started = loop.time()
            try:
                body = tool_calling_request(f"{self._run_id}-{next(self._next)}")
                reply = await client.post(f"{self.url}/v1/chat/completions", json=body)
                self.sent += 1
                self.failed += reply.status_code != 200
            except httpx.HTTPError:
                self.failed += 1
                await asyncio.sleep(0.2)  # the double restarting with a new template
            await asyncio.sleep(max(0.0, started + self._gap - loop.time()))

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(self._client(client) for _ in range(self.CLIENTS)))

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def tap_ports() -> dict[str, int]:
    """Free ports for the engine double, a tap in front of it, and the tap's /metrics."""
    return {"engine": free_port(), "tap": free_port(), "tap_metrics": free_port()}


def guard_operator(
    kubeconfig: Path, namespace: str, log_dir: Path, ports: dict[str, int], **env: str
) -> OperatorProcess:
    """`dsv4 run` allowed to reach every one of `ports` on 127.0.0.1 (the double, the tap, its
    metrics), canaries as often as every second, with the settings `env`; started."""
    allowed = ",".join(f"http://127.0.0.1:{port}" for port in ports.values())
    return OperatorProcess(
        kubeconfig,
        namespace,
        log_dir,
        wrap=None,
        DSV4_CANARY_ENDPOINT_ALLOW=allowed,
        DSV4_MIN_CANARY_INTERVAL="1s",
        **env,
    ).start()
