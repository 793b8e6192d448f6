"""Benchmark of the leak tap's overhead: the same upstream, direct and through the tap.

Three processes: an upstream stand-in (streams an SSE chat completion of 0.5-1.5 times
`--chunks` chunks of realistic size, `--gap-ms` apart on average, each preceded by an SSE
comment with its send time on the shared monotonic clock), the tap (`dsv4 tap`, with its
classifier process), and the load generator (one keep-alive connection per session).
Upstream and load generator are raw asyncio protocols on uvloop, a few microseconds per
chunk, so that they do not starve the tap of CPU at 256 sessions. Every request offers
tools, so every response is copied to the classifier: the tap's worst case.

Two chunk timings, each its own table (`--timing`): `steps`, one engine's decode loop, where
every gap each running stream gets its next chunk, all back to back (a batch's tokens leave
an engine together: the tap sees bursts of as many chunks as there are streams); and
`streams`, each stream on its own clock with gaps of 0.5-1.5 times the mean (streams spread
over engines, time per token varying).

For 1, 64 and 256 concurrent streaming sessions it runs `--warmup` + `--seconds` direct,
then as long through the tap, `--rounds` times in turn (a machine whose speed drifts, as a
shared VM's does, slows both alike), and prints for each run, over its last `--seconds`,
p50/p99 of time to first byte, of the whole request, and of each chunk's delivery delay
(arrival - send); then the tap's added latency (tap - direct) per request and per chunk, the
median over the rounds with the lowest and highest. The warm-up keeps the opening burst
(every session connecting and sending at once) out of the steady state; each connection's
first request is reported apart, since through the tap it also waits for the tap's own
connection to the router. With each row, the CPU each process used (cores busy, from /proc;
for the tap, the share spent in the kernel: system calls and loopback TCP). Then a
throughput phase (no gaps) prints streamed requests/s and the tap's requests/s per core
(requests / CPU seconds of the tap process, and of the tap with its classifier). Each phase
also says how many copies the classifier had to drop (from the tap's /metrics): at
saturation the relay has the CPU first, and what the classifier cannot keep up with is
dropped and counted.

With `--tap-workers N` the tap runs N relay processes on its port (`dsv4 tap --workers`), and
the tap's CPU is theirs and their parent's, the classifier's that of their N classifiers.

With `--reference-proxy /usr/sbin/haproxy` each round also runs the same load through HAProxy
(HTTP mode, one thread, `option http-no-delay`, on the tap's CPU) and prints what it adds,
the same figures: the floor a C event-loop proxy sets on this machine, against which to read
the tap's (both pay the same system calls and loopback TCP per chunk). Then the tap against
HAProxy directly, round by round (tap - HAProxy, with the range over the rounds: a range
across zero is no difference these rounds can tell), and each relay's CPU per chunk: the
"added" figures subtract the direct run, whose load generator and upstream share a CPU, and
HAProxy's can be nil or negative, where a ratio to it says nothing.

With `--tap-command CMD` another relay runs in the tap's place, measured the same way (the
native relay probe, bench/probes/native_relay, says how).

With `--pin` (the default on a machine of 2 or more cores) the upstream stand-in and the load
generator share CPU 0 and the tap with its classifier gets the others, as the tap has its own
CPU in the router pod: otherwise, on a small machine, the figures are the harness's
contention for the cores more than the tap's cost.

    python bench/tap.py [--seconds 5] [--rounds 3] [--warmup 1] [--chunks 40] [--gap-ms 15]
                        [--timing steps,streams] [--no-pin] [--no-tools]
                        [--tap-workers 1] [--tap-command CMD] [--reference-proxy PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import cast

import uvloop
from prometheus_client.parser import text_string_to_metric_families

from dsv4_devcluster.process import (
    ManagedProcess,
    children,
    cpu_times,
    exit_on_sigterm,
    free_port,
    spawned_children,
    wait_listening,
)

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
# A token or two per chunk, as an engine streams them (about 60-120 bytes of SSE each).
TEXT = "The quick brown fox jumps over the lazy dog while the model keeps on streaming. "


class _DecodeSteps:
    """One engine's decode loop: every `gap` seconds each running stream gets its next chunk,
    all of them back to back, as a batch's tokens leave an engine after each step."""

    def __init__(self, gap: float) -> None:
        self.gap = gap
        self.streams: list[_StreamingUpstream] = []
        self._next = 0.0

    def join(self, stream: _StreamingUpstream) -> None:
        if not self.streams:  # the loop was idle: the next step is one gap away
            loop = asyncio.get_running_loop()
            self._next = loop.time() + self.gap
            loop.call_at(self._next, self._step)
        self.streams.append(stream)

    def _step(self) -> None:
        self.streams = [stream for stream in self.streams if stream.send_next()]
        if self.streams:
            self._next += self.gap
            asyncio.get_running_loop().call_at(self._next, self._step)


class _StreamingUpstream(asyncio.Protocol):
    """The router's stand-in on one connection: answers each request (a head and a
    Content-Length body) with `chunks` SSE events, chunked, each preceded by a comment with its
    send time. With `X-Timing: steps` the chunks follow the engine's decode steps (shared by
    every stream); with `streams`, each stream has its own clock, gaps drawn from 0.5-1.5
    times the mean (several engines, varying time per token). Raw asyncio: per chunk a write,
    no framework."""

    def __init__(self, chunks: int, gap_ms: float, steps: _DecodeSteps) -> None:
        self.chunks, self.gap_ms, self.steps = chunks, gap_ms, steps
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.sent = self.length = 0
        self.gap = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, separator, rest = self.buffer.partition(b"\r\n\r\n")
        if not separator:
            return
        fields = dict(
            line.split(b": ", 1) for line in head.lower().split(b"\r\n")[1:] if b": " in line
        )
        length = int(fields.get(b"content-length", b"0"))
        if len(rest) < length:
            return
        self.buffer = rest[length:]
        self.gap = float(fields.get(b"x-gap-ms", str(self.gap_ms).encode())) / 1000
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        # Lengths vary (0.5-1.5x the mean) as answers do, so sessions do not all end together.
        self.length = random.randint(self.chunks // 2, self.chunks * 3 // 2)
        self.sent = 0
        if fields.get(b"x-timing") == b"steps" and self.gap:
            self.steps.join(self)
        else:
            self._on_own_clock()

    def _on_own_clock(self) -> None:
        while self.send_next():
            if self.gap:
                gap = self.gap * random.uniform(0.5, 1.5)
                asyncio.get_running_loop().call_later(gap, self._on_own_clock)
                return

    def send_next(self) -> bool:
        """Send the next chunk (or the end); False when the response is over."""
        assert self.transport is not None
        if self.transport.is_closing():
            return False
        if self.sent == self.length:
            self.transport.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            return False
        event = b": t=%.6f\n%s" % (time.monotonic(), _EVENTS[self.sent % len(_EVENTS)])
        self.transport.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.sent += 1
        return True


def _event(i: int) -> bytes:
    delta = TEXT[(i * 7) % 60 : (i * 7) % 60 + 12]
    choice = {"index": 0, "delta": {"content": delta}}
    data = {"object": "chat.completion.chunk", "choices": [choice]}
    return f"data: {json.dumps(data)}\n\n".encode()


TIMINGS = {
    "steps": "one engine's decode steps: every gap, each stream's chunk, back to back",
    "streams": "each stream on its own clock, gaps 0.5-1.5x the mean",
}

# The chunks' SSE events, made once: the stand-in's CPU goes to sending, as an engine's would.
_EVENTS = [_event(i) for i in range(60)]


def _upstream(bound: Connection, chunks: int, gap_ms: float) -> None:
    """The upstream stand-in's process: serves on a port the kernel picks and sends it on
    `bound` (a port chosen beforehand was once taken by another test's connection before
    this bound it, and the bench then measured whatever listened there)."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        clock = _DecodeSteps(gap_ms / 1000)
        server = await loop.create_server(
            lambda: _StreamingUpstream(chunks, gap_ms, clock), "127.0.0.1", 0
        )
        bound.send(server.sockets[0].getsockname()[1])
        bound.close()
        await server.serve_forever()

    uvloop.run(serve())


@dataclass
class Samples:
    """What one phase measured after its warm-up (`since`), and apart from it the first
    request of each connection (through the tap it also waits for the router connection)."""

    since: float
    ttfb: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    chunk: list[float] = field(default_factory=list)
    first_ttfb: list[float] = field(default_factory=list)
    requests: int = 0
    chunks: int = 0  # every chunk of the phase, warm-up included (CPU per chunk)


class _Session(asyncio.Protocol):
    """One client connection sending one streaming request after another (keep-alive),
    recording when each chunk's send-time comment arrives. Raw asyncio, as the upstream."""

    def __init__(self, request: bytes, out: Samples, deadline: float) -> None:
        self.request, self.out, self.deadline = request, out, deadline
        self.transport: asyncio.Transport | None = None
        self.done = asyncio.get_running_loop().create_future()
        self.tail = b""
        self.fresh = True  # the connection's first request

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.started, self.first, self.tail = time.monotonic(), 0.0, b""
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        self.first = self.first or now
        out, measured = self.out, now >= self.out.since
        data = self.tail + data
        at = data.find(b": t=")
        while at >= 0:
            end = data.find(b"\n", at)
            if end < 0:
                break
            out.chunks += 1
            if measured:
                out.chunk.append(now - float(data[at + 4 : end]))
            at = data.find(b": t=", end)
        if data.endswith(b"\r\n0\r\n\r\n"):
            if self.fresh:
                out.first_ttfb.append(self.first - self.started)
            if self.started >= out.since:
                if not self.fresh:
                    out.ttfb.append(self.first - self.started)
                out.total.append(now - self.started)
                out.requests += 1
            self.fresh = False
            if now < self.deadline:
                self._send()
            else:
                assert self.transport is not None
                self.transport.close()
            return
        # Keep what a stamp or the end marker may continue from: an unfinished stamp, or the
        # last 8 bytes (shorter than any whole stamp line, so never counted twice).
        self.tail = data[at:] if at >= 0 else data[-8:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def _load(
    url: str,
    concurrency: int,
    seconds: float,
    gap_ms: float,
    tools: bool = True,
    timing: str = "steps",
    warmup: float = 0.0,
) -> Samples:
    """`concurrency` sessions for `warmup` + `seconds`; samples of the last `seconds` only
    (the first requests, all at once, measure connection set-up, reported apart)."""
    out = Samples(since=time.monotonic() + warmup)
    host, port = url.removeprefix("http://").split(":")
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    body = json.dumps(chat | ({"tools": TOOLS} if tools else {})).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"X-Gap-Ms: {gap_ms}\r\nX-Timing: {timing}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    deadline = out.since + seconds
    loop = asyncio.get_running_loop()
    sessions = [
        (await loop.create_connection(lambda: _Session(request, out, deadline), host, int(port)))[1]
        for _ in range(concurrency)
    ]
    await asyncio.gather(*(session.done for session in sessions))
    return out


def _group_times(pids: list[int]) -> tuple[float, float]:
    """(user, system) CPU seconds of processes together (a tap's workers, say)."""
    times = [cpu_times(pid) for pid in pids]
    return sum(user for user, _ in times), sum(system for _, system in times)


def _start(name: str, argv: list[str], logs: Path, cpus: list[int] | None) -> ManagedProcess:
    """`argv` (on `cpus`, when given) as a dev-cluster process, its output in `logs`: stopped
    at the bench's exit, and killed by the kernel should the bench die (left running, it would
    hold its port and CPU through the runs that follow, and skew them)."""
    pinned = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    return ManagedProcess(name, [*pinned, *argv], logs / f"{name}.log")


def _cpu_seconds(pids: list[int]) -> float:
    return sum(_group_times(pids))


class CpuMeter:
    """CPU used by named groups of processes since `start`: cores busy, and the share in the
    kernel (system calls, TCP) for the tap."""

    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids
        self._before: dict[str, tuple[float, float]] = {}

    def start(self) -> None:
        self._before = {name: _group_times(pids) for name, pids in self.pids.items()}

    def seconds(self, name: str) -> float:
        """CPU seconds of the group `name` since `start`."""
        return _cpu_seconds(self.pids[name]) - sum(self._before[name])

    def cores(self, seconds: float) -> str:
        parts = []
        for name, pids in self.pids.items():
            now = _group_times(pids)
            user, system = (a - b for a, b in zip(now, self._before[name], strict=True))
            kernel = f" ({system / (user + system):.0%} kernel)" if name == "tap" and user else ""
            parts.append(f"{name} {(user + system) / seconds:.2f}{kernel}")
        return ", ".join(parts)


def _classifier_counts(metrics_url: str) -> tuple[float, float]:
    """(responses classified, copies dropped) so far, from the tap's /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    totals = {"dsv4_traffic_responses": 0.0, "dsv4_tap_classifier_dropped": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name in totals:
            totals[family.name] += sum(sample.value for sample in family.samples)
    return totals["dsv4_traffic_responses"], totals["dsv4_tap_classifier_dropped"]


def _q(values: list[float], q: float) -> float:
    """The `q` quantile in ms; nan when the window caught nothing (a machine far too slow)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


#: The tap's added latency figures: label -> (samples, quantile).
ADDED = {
    "request p50": ("ttfb", 0.5),
    "request p99": ("ttfb", 0.99),
    "chunk p50": ("chunk", 0.5),
    "chunk p99": ("chunk", 0.99),
    "first request p50": ("first_ttfb", 0.5),
}


def _added(direct: Samples, tap: Samples) -> dict[str, float]:
    """One round's added latency (ms): tap minus direct, per figure."""
    return {
        label: _q(getattr(tap, of), q) - _q(getattr(direct, of), q)
        for label, (of, q) in ADDED.items()
    }


def _ratios(sessions: int, tap: list[dict[str, float]], reference: list[dict[str, float]]) -> str:
    """The tap's added latency over HAProxy's, figure by figure (medians over the same
    rounds): the comparison a shared machine cannot spoil, both measured in the same minutes."""

    def ratio(label: str) -> str:
        ours = statistics.median(added[label] for added in tap)
        theirs = statistics.median(added[label] for added in reference)
        return f"{label} {ours / theirs:.2f}x" if theirs > 0 else f"{label} -"

    return f"{sessions:8}  " + ", ".join(map(ratio, ("request p50", "chunk p50", "chunk p99")))


#: The tap against HAProxy directly, per round: label -> (samples, quantile).
VERSUS = {"request p50": ("ttfb", 0.5), "chunk p50": ("chunk", 0.5), "chunk p99": ("chunk", 0.99)}


def _versus(tap: Samples, reference: Samples) -> dict[str, float]:
    """One round's tap - HAProxy (ms), figure by figure: read without the direct run, whose
    own latency (the load generator and the upstream on one CPU) the "added" figures subtract
    and which can make HAProxy's added latency nil or negative."""
    return {
        label: _q(getattr(tap, of), q) - _q(getattr(reference, of), q)
        for label, (of, q) in VERSUS.items()
    }


def _versus_summary(
    sessions: int, rounds: list[dict[str, float]], per_chunk: dict[str, list[float]]
) -> str:
    """Each tap - HAProxy figure's median over the rounds with the lowest and highest (a
    range across zero: no difference this many rounds can tell), then the CPU per chunk."""

    def figure(label: str) -> str:
        values = sorted(versus[label] for versus in rounds)
        return f"{label} {statistics.median(values):+.3f} ({values[0]:+.3f}..{values[-1]:+.3f})"

    tap, reference = (statistics.median(per_chunk[name]) for name in ("tap", "haproxy"))
    cpu = f"CPU per chunk {tap:.1f} us vs {reference:.1f} us ({tap / reference:.2f}x)"
    return f"{sessions:8}  " + ", ".join(map(figure, VERSUS)) + f"; {cpu}"


def _summary(sessions: int, rounds: list[dict[str, float]], tail: str = "") -> str:
    """Each figure's median over the rounds, with the lowest and highest."""

    def figure(label: str) -> str:
        values = sorted(added[label] for added in rounds)
        spread = f" ({values[0]:+.2f}..{values[-1]:+.2f})" if len(values) > 1 else ""
        return f"{label} {statistics.median(values):+.2f}{spread}"

    return f"{sessions:8}  " + ", ".join(map(figure, ADDED)) + tail


HAPROXY_CONFIG = """global
    nbthread 1
    maxconn 4096
defaults
    mode http
    option http-no-delay
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend bench
    bind 127.0.0.1:{port}
    default_backend upstream
backend upstream
    http-reuse always
    server upstream 127.0.0.1:{upstream}
"""


def _start_reference(
    binary: str, port: int, upstream: int, logs: Path, cpus: list[int] | None
) -> ManagedProcess:
    """HAProxy relaying to the upstream as the tap does: HTTP mode, one thread, no delay;
    returned once it listens (it has read its configuration by then)."""
    with tempfile.TemporaryDirectory() as config_dir:
        config = os.path.join(config_dir, "haproxy.cfg")
        with open(config, "w") as out:
            out.write(HAPROXY_CONFIG.format(port=port, upstream=upstream))
        check = subprocess.run([binary, "-c", "-q", "-f", config], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"{binary} refused its configuration: {check.stderr}")
        proxy = _start("haproxy", [binary, "-db", "-f", config], logs, cpus)
        wait_listening(port, proxy.popen)
    return proxy


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--rounds", type=int, default=3, help="direct/tap pairs per figure, alternating"
    )
    parser.add_argument("--chunks", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=15.0)
    parser.add_argument("--sessions", default="1,64,256")
    parser.add_argument(
        "--timing",
        default="steps,streams",
        help="steps: chunks on one engine's decode steps (all streams at once); streams: each "
        "stream on its own clock, gaps 0.5-1.5x the mean",
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of each phase not measured"
    )
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument(
        "--tools",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="requests offer tools (every response classified); --no-tools: the relay alone",
    )
    parser.add_argument(
        "--tap-workers", type=int, default=1, help="the tap's --workers (relay processes)"
    )
    parser.add_argument(
        "--tap-command",
        metavar="CMD",
        help="run this in the tap's place (another relay to measure; {listen}, {upstream} and "
        "{metrics} are host:port, {python} this interpreter): its child processes are counted "
        "as its classifier, and /metrics need only give dsv4_tap_classifier_dropped",
    )
    parser.add_argument(
        "--reference-proxy",
        metavar="PATH",
        help="an haproxy binary: also measure it on the same load, as a floor for the tap",
    )
    args = parser.parse_args()
    # The tap's and HAProxy's output, removed with the bench's exit.
    kept_logs = tempfile.TemporaryDirectory(prefix="dsv4-tap-bench-")
    logs = Path(kept_logs.name)
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) >= 2 if args.pin is None else args.pin
    if pin:  # this process (the load generator) and the upstream it spawns: the first CPU
        os.sched_setaffinity(0, cpus[:1])
    ctx = multiprocessing.get_context("spawn")
    port_of_upstream, bound = ctx.Pipe(duplex=False)
    upstream = ctx.Process(target=_upstream, args=(bound, args.chunks, args.gap_ms), daemon=True)
    upstream.start()

    # SIGTERM: the tap, HAProxy and the upstream stand-in end with the bench, at once.
    exit_on_sigterm(upstream.kill, kept_logs.cleanup)
    bound.close()
    if not port_of_upstream.poll(30):
        raise TimeoutError("the upstream stand-in did not bind within 30 s")
    up_port: int = port_of_upstream.recv()
    tap_port, metrics_port = free_port(), free_port()
    up_url, tap_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{tap_port}"
    # The tap as it runs in the router pod, `dsv4 tap` (it starts its classifier process), or
    # the relay to measure in its place.
    command = (
        shlex.split(
            args.tap_command.format(
                listen=f"127.0.0.1:{tap_port}", upstream=f"127.0.0.1:{up_port}",
                metrics=f"127.0.0.1:{metrics_port}", python=sys.executable,
            )
        )
        if args.tap_command
        else [sys.executable, "-m", "dsv4_operator.cli", "tap", "--upstream", up_url,
              "--listen", f"127.0.0.1:{tap_port}", "--metrics", f"127.0.0.1:{metrics_port}",
              "--deployment", "bench", "--workers", str(args.tap_workers)]
    )  # fmt: skip
    tap = _start("tap", command, logs, cpus[1:] if pin else None)
    wait_listening(tap_port, tap.popen)
    wait_listening(metrics_port, tap.popen)  # with workers: once every one of them serves
    if args.tap_command:
        relays, classifiers = [tap.pid], children(tap.pid)
    else:
        relays = spawned_children(tap.pid) if args.tap_workers > 1 else [tap.pid]
        classifiers = [child for relay in relays for child in spawned_children(relay)]
        if len(relays) != args.tap_workers or len(classifiers) != args.tap_workers:
            raise LookupError(
                f"the tap (pid {tap.pid}): relays {relays}, classifiers {classifiers}"
            )
    pids = {"load": [os.getpid()], "upstream": [upstream.pid or 0], "tap": [tap.pid]}
    if args.tap_workers > 1:
        pids["tap"] += relays
    paths = {"direct": up_url, "tap": tap_url}
    reference = None
    if args.reference_proxy:
        ref_port = free_port()
        reference = _start_reference(
            args.reference_proxy, ref_port, up_port, logs, cpus[1:] if pin else None
        )
        paths["haproxy"] = f"http://127.0.0.1:{ref_port}"
        pids["haproxy"] = [reference.pid]
    meter = CpuMeter(pids | {"classifier": classifiers})
    where = f"pinned: load+upstream on CPU {cpus[0]}, tap on {cpus[1:]}" if pin else "not pinned"
    print(
        f"{len(cpus)} cores ({where}); {args.chunks} chunks per response on average, "
        f"{args.gap_ms:g} ms apart; {args.seconds:g}s per phase after {args.warmup:g}s of warm-up; "
        + ("every request offers tools (all classified)" if args.tools else "no tools (relay only)")
    )
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    for timing in args.timing.split(","):
        print(f"\ntiming: {timing} ({TIMINGS[timing]})")
        print(
            "sessions  path     req/s  ttfb p50/p99 ms  total p50/p99 ms  chunk p50/p99 ms  cores"
        )
        summaries: list[str] = []
        references: list[str] = []
        ratios: list[str] = []
        versus: list[str] = []
        for sessions in (int(s) for s in args.sessions.split(",")):
            rounds: list[dict[str, float]] = []
            reference_rounds: list[dict[str, float]] = []
            versus_rounds: list[dict[str, float]] = []
            per_chunk: dict[str, list[float]] = {"tap": [], "haproxy": []}  # relay CPU, us
            dropped_before = _classifier_counts(metrics_url)[1]
            for _ in range(args.rounds):  # alternating, so that a drift of the machine is shared
                runs = {}
                for name, url in paths.items():
                    load = _load(
                        url, sessions, args.seconds, args.gap_ms, args.tools, timing, args.warmup
                    )
                    meter.start()
                    s = runs[name] = uvloop.run(load)
                    print(
                        f"{sessions:8}  {name:7} {s.requests / args.seconds:6.0f}  "
                        f"{_q(s.ttfb, 0.5):6.2f}/{_q(s.ttfb, 0.99):6.2f}  "
                        f"{_q(s.total, 0.5):8.1f}/{_q(s.total, 0.99):7.1f}  "
                        f"{_q(s.chunk, 0.5):7.3f}/{_q(s.chunk, 0.99):7.3f}  "
                        f"{meter.cores(args.seconds + args.warmup)}"
                    )
                    if name in per_chunk and s.chunks:
                        per_chunk[name].append(meter.seconds(name) / s.chunks * 1e6)
                rounds.append(_added(runs["direct"], runs["tap"]))
                if "haproxy" in runs:
                    reference_rounds.append(_added(runs["direct"], runs["haproxy"]))
                    versus_rounds.append(_versus(runs["tap"], runs["haproxy"]))
            dropped = _classifier_counts(metrics_url)[1] - dropped_before
            summaries.append(_summary(sessions, rounds, f"; copies dropped {dropped:.0f}"))
            if reference_rounds:
                references.append(_summary(sessions, reference_rounds))
                ratios.append(_ratios(sessions, rounds, reference_rounds))
                versus.append(_versus_summary(sessions, versus_rounds, per_chunk))
        print(
            f"added by the tap (tap - direct, ms; median of {args.rounds} rounds, lowest..highest"
            "; request: time to first byte; first request: a connection's first, sent with all "
            "the others at once):"
        )
        print("\n".join(summaries))
        if references:
            print("added by haproxy (haproxy - direct, ms; the same figures, the same rounds):")
            print("\n".join(references))
            print("the tap's added latency over haproxy's (medians of the same rounds):")
            print("\n".join(ratios))
            print(
                "the tap against haproxy, directly (tap - haproxy, ms; median of the rounds, "
                "lowest..highest), and each relay process's CPU per chunk relayed (medians):"
            )
            print("\n".join(versus))
    # Throughput: no gaps, 64 sessions; the tap's CPU time gives requests/s per core.
    classified, dropped = _classifier_counts(metrics_url)
    before = _cpu_seconds(pids["tap"]), _cpu_seconds(classifiers)
    s = uvloop.run(_load(tap_url, 64, args.seconds, 0.0, args.tools))
    used = _cpu_seconds(pids["tap"]) - before[0]
    with_classifier = used + _cpu_seconds(classifiers) - before[1]
    time.sleep(2)  # the classifier's backlog drains (or stays dropped)
    now_classified, now_dropped = _classifier_counts(metrics_url)
    print(
        f"throughput through the tap (no gaps, 64 sessions): {s.requests / args.seconds:.0f} "
        f"streamed requests/s, tap process CPU {used:.1f}s = "
        f"{s.requests / used if used else float('inf'):.0f} requests/s per core "
        f"({s.requests / with_classifier if with_classifier else float('inf'):.0f} with the "
        f"classifier's CPU; p50 total {statistics.median(s.total) * 1000:.1f} ms); "
        f"classified {now_classified - classified:.0f}, dropped {now_dropped - dropped:.0f}"
    )
    tap.stop()
    upstream.terminate()
    upstream.join(10)
    if reference is not None:
        reference.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
