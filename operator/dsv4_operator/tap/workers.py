"""The tap on more than one core: worker processes that each run the whole tap (relay and
classifier) on the same port, and a parent that restarts them and serves their /metrics summed.

One event loop relays about 17,000 chunks/s on 0.6 of a core (bench/tap.py); a router with more
traffic than that needs more loops. Each worker listens with SO_REUSEPORT, so the kernel spreads
the connections over them, and serves its /metrics on a Unix socket only its parent reads. The
parent's /metrics sums the workers' samples; a worker that died is restarted, and what it had
counted up to the parent's last read of it stays in the sums, so counters do not go down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from dsv4_operator.series import SCOPE
from dsv4_operator.tap.proxy import TapConfig, add_canary, run_tap

log = logging.getLogger(__name__)

SUPERVISE_SECONDS = 1.0
#: How long a worker may take to start (a Python interpreter and its classifier).
START_SECONDS = 60.0
READ_SECONDS = 5.0

#: (family name, sample name, sorted labels) -> value
Samples = dict[tuple[str, str, tuple[tuple[str, str], ...]], float]


class WorkerFailed(RuntimeError):
    """A worker could not start (the address taken, say); the message is the worker's error."""


def _worker_main(
    config: TapConfig,
    listen: tuple[str, int],
    socket_path: str,
    ready: multiprocessing.connection.Connection,
) -> None:
    """A worker process: the whole tap, /metrics on `socket_path`; says "ready" or its error."""
    from dsv4_operator import event_loop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
    try:
        event_loop.run(
            run_tap(config, listen, socket_path, reuse_port=True, ready=lambda: ready.send("ready"))
        )
    except Exception as exc:
        with contextlib.suppress(OSError):
            ready.send(f"{type(exc).__name__}: {exc}")
        raise


@dataclass
class _Slot:
    """One worker place: its process, its metrics socket, what was read from it."""

    index: int
    socket_path: str
    process: multiprocessing.context.SpawnProcess | None = None
    families: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (type, help)
    last: Samples = field(default_factory=dict)  # its counters at the last read
    retired: Samples = field(default_factory=dict)  # what its dead predecessors had counted
    generation: int = 0  # worker processes retired from this slot

    def retire(self) -> None:
        """Its worker died: what it counted stays in the sums (its gauges go with it)."""
        for key, value in self.last.items():
            if self.families[key[0]][0] != "gauge":
                self.retired[key] = self.retired.get(key, 0.0) + value
        self.last = {}
        self.generation += 1


class WorkerPool:
    """Starts `count` workers, restarts those that die, reads and sums their /metrics."""

    def __init__(
        self, config: TapConfig, listen: tuple[str, int], count: int, socket_dir: Path
    ) -> None:
        self.config, self.listen = config, listen
        self._ctx = multiprocessing.get_context("spawn")
        self.slots = [_Slot(i, str(socket_dir / f"worker-{i}.sock")) for i in range(count)]
        self.restarts = 0

    def _spawn(self, slot: _Slot) -> None:
        """Start the slot's worker and wait until it serves; WorkerFailed when it cannot."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slot.socket_path)
        theirs, ours = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_worker_main,
            args=(self.config, self.listen, slot.socket_path, ours),
            name=f"dsv4-tap-worker-{slot.index}",
        )
        process.start()
        ours.close()
        try:
            said = theirs.recv() if theirs.poll(START_SECONDS) else "did not start in time"
        except EOFError:
            said = f"exited with code {process.exitcode}"
        finally:
            theirs.close()
        if said != "ready":
            process.kill()
            process.join(5)
            raise WorkerFailed(f"tap worker {slot.index}: {said}")
        slot.process = process

    def start(self) -> None:
        for slot in self.slots:
            self._spawn(slot)

    def alive(self) -> int:
        return sum(1 for s in self.slots if s.process is not None and s.process.is_alive())

    async def supervise_once(self) -> None:
        """Restart each worker that died; its counts so far stay in the sums."""
        for slot in self.slots:
            if slot.process is not None and slot.process.is_alive():
                continue
            if slot.process is not None:
                log.warning(
                    "tap worker %d exited with code %s; restarting it",
                    slot.index,
                    slot.process.exitcode,
                )
                slot.process = None
                slot.retire()
                self.restarts += 1
            await asyncio.to_thread(self._spawn, slot)

    async def supervise(self) -> None:
        while True:
            await asyncio.sleep(SUPERVISE_SECONDS)
            try:
                await self.supervise_once()
            except Exception:  # out of processes, say: the next pass tries again
                log.exception("a tap worker could not be restarted (the others go on)")

    async def read(self, slot: _Slot) -> None:
        """Read one worker's /metrics into its slot (left as it was when it cannot be read,
        or when the worker was retired meanwhile: its counts are in `retired` by then)."""
        generation = slot.generation
        connector = aiohttp.UnixConnector(path=slot.socket_path)
        timeout = aiohttp.ClientTimeout(total=READ_SECONDS)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.get("http://worker/metrics") as reply,
            ):
                text = await reply.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return
        if slot.generation != generation:
            return
        samples: Samples = {}
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):
                continue  # creation times do not add up
            slot.families[family.name] = (family.type, family.documentation)
            for sample in family.samples:
                key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                samples[key] = sample.value
        slot.last = samples

    def summed(self) -> Iterator[Metric]:
        """The workers' samples summed by family, name and labels, dead workers' counts
        included."""
        families: dict[str, tuple[str, str]] = {}
        totals: dict[str, Samples] = {}
        for slot in self.slots:
            families.update(slot.families)
            for source in (slot.last, slot.retired):
                for key, value in source.items():
                    into = totals.setdefault(key[0], {})
                    into[key] = into.get(key, 0.0) + value
        for name, samples in totals.items():
            kind, documentation = families[name]
            metric = Metric(name, documentation, kind)
            for (_, sample, labels), value in samples.items():  # as the workers order them
                metric.add_sample(sample, dict(labels), value)
            yield metric


class _PoolCollector(Collector):
    """The workers' metrics summed, and the pool's own."""

    def __init__(self, pool: WorkerPool, scope: tuple[str, str]) -> None:
        self.pool, self.scope = pool, list(scope)

    def collect(self) -> Iterator[Metric]:
        yield from self.pool.summed()
        workers = GaugeMetricFamily(
            "dsv4_tap_workers", "Tap worker processes running.", labels=list(SCOPE)
        )
        workers.add_metric(self.scope, self.pool.alive())
        yield workers
        restarts = CounterMetricFamily(
            "dsv4_tap_worker_restarts",
            "Tap worker processes restarted after they died.",
            labels=list(SCOPE),
        )
        restarts.add_metric(self.scope, self.pool.restarts)
        yield restarts


def pool_collector(pool: WorkerPool, scope: tuple[str, str]) -> Collector:
    """What the parent's /metrics serves (read from the workers at each scrape); `scope`: the
    values of series.SCOPE."""
    return _PoolCollector(pool, scope)


async def run_pool(
    config: TapConfig,
    listen: tuple[str, int],
    metrics: tuple[str, int],
    count: int,
    socket_dir: Path,
) -> None:
    """Serve with `count` workers until cancelled or SIGTERM; WorkerFailed if one cannot start."""
    pool = WorkerPool(config, listen, count, socket_dir)
    registry = CollectorRegistry()
    registry.register(pool_collector(pool, config.scope))

    async def serve_metrics(request: web.Request) -> web.Response:
        await asyncio.gather(*(pool.read(slot) for slot in pool.slots))
        # On the loop, not in a thread: the supervisor changes the slots between awaits.
        payload = generate_latest(registry)
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", serve_metrics)
    add_canary(app, config)  # on the parent: one per tap, whatever the workers
    runner = web.AppRunner(app)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    supervisor: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(pool.start)
        await runner.setup()
        await web.TCPSite(runner, *metrics).start()
        supervisor = asyncio.create_task(pool.supervise())
        log.info(
            "tap: %d workers on %s:%d -> %s (metrics on %s:%d)",
            count, *listen, config.upstream, *metrics,
        )  # fmt: skip
        await stop.wait()
    finally:
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        await runner.cleanup()
        await asyncio.to_thread(_stop_all, pool)


def _stop_all(pool: WorkerPool) -> None:
    """SIGTERM each worker (its classifier ends with it), SIGKILL what is left after 5 s."""
    processes = [s.process for s in pool.slots if s.process is not None]
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
