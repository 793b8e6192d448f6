"""Child processes of the dev cluster: start in their own process group, stop by PID, reap at exit.

Every process is started with ``start_new_session=True`` (its PID is its process-group id)
and logs to a file. :meth:`ManagedProcess.stop` sends SIGTERM to the group, then SIGKILL
after a grace period. Live processes are kept in a module-level registry that an ``atexit``
hook drains, so an interpreter exit (test failure, Ctrl-C, ``sys.exit``) leaves nothing
behind. When started from the main thread, children also get ``PR_SET_PDEATHSIG=SIGKILL``
(via util-linux ``setpriv``) so that even a SIGKILL of the Python process takes them down.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()


class ManagedProcess:
    """One running binary (etcd, kube-apiserver, ...) with its log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        prefix: list[str] = []
        setpriv = shutil.which("setpriv")
        if setpriv and threading.current_thread() is threading.main_thread():
            prefix = [setpriv, "--pdeathsig", "KILL", "--"]
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                prefix + self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(env) if env is not None else None,
            )
        self.pid = self.popen.pid
        with _LIVE_LOCK:
            _LIVE.add(self)

    def alive(self) -> bool:
        """True while the process has not exited."""
        return self.popen.poll() is None

    def stop(self, grace_seconds: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_seconds``, and reap it."""
        try:
            if self.alive():
                _signal_group(self.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=grace_seconds)
            # Kill stragglers in the group even if the leader already exited.
            _signal_group(self.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace_seconds)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def log_tail(self, lines: int = 40) -> str:
        """Last ``lines`` lines of the process's combined stdout/stderr."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid})"


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def live_processes() -> list[ManagedProcess]:
    """Processes started here and not yet stopped (for diagnostics and tests)."""
    with _LIVE_LOCK:
        return list(_LIVE)


def stop_all(grace_seconds: float = 5.0) -> None:
    """Stop every live process, newest first (the ``atexit`` hook)."""
    for proc in sorted(live_processes(), key=lambda p: p.pid, reverse=True):
        proc.stop(grace_seconds)


atexit.register(stop_all)


def exit_on_sigterm(*cleanups: Callable[[], object]) -> None:
    """For a script (a bench): on SIGTERM, kill every live process started here (its group),
    run `cleanups`, and exit 143 at once. Not by raising SystemExit: raised amid an event
    loop's work it is not sure to end the run, and `stop_all` would wait on each process."""

    def stopped(signum: int, _: object) -> None:
        # Not live_processes(): the main thread may hold its lock where the signal came.
        for proc in list(_LIVE):
            _signal_group(proc.pid, signal.SIGKILL)
        for cleanup in cleanups:
            with contextlib.suppress(Exception):  # the exit must happen whatever fails
                cleanup()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)


# Ports handed out by `free_port`: below the kernel's own picks, above most fixed ones.
LOWEST_PORT = 15000
# How long a handed-out port is kept from other `free_port` calls: time for its user to bind
# it (a process's start-up); once bound, the bind itself keeps it.
RESERVED_S = 600.0
PORT_RESERVATIONS = Path(tempfile.gettempdir()) / f"dsv4-ports-{os.getuid()}"


def free_port() -> int:
    """A TCP port, free now on every local address, that nothing else will take before its
    user binds it: not one the kernel picks (its ephemeral range, where it takes the ports of
    outgoing connections and of binds to port 0, is left out), and not one another test
    process on this machine was given in the last `RESERVED_S` (a reservation file each,
    written under one lock). The kernel's own pick, the way before, could be taken by any
    connection between the pick and the bind."""
    low, high = ephemeral_ports()
    candidates = [*range(LOWEST_PORT, low), *range(high + 1, 65536)]
    if len(candidates) < 1000:  # a kernel that picks from nearly all ports: share them
        candidates = list(range(LOWEST_PORT, 65536))
    start = random.randrange(len(candidates))  # processes started together start apart
    return reserve_port(candidates[start:] + candidates[:start])


def wait_listening(
    port: int, process: subprocess.Popen[bytes] | None = None, timeout: float = 30.0
) -> None:
    """Until something listens on 127.0.0.1:`port`; `process`, the one meant to: fail when it
    exited (its port taken since `free_port` picked it), rather than use whatever listens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"pid {process.pid} exited ({process.returncode}) before {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port} after {timeout:g} s")


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the ports it picks itself (Linux's default: 32768-60999)."""
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    low, high = (int(part) for part in text.split())
    return low, high


def reserve_port(candidates: Sequence[int], now: Callable[[], float] = time.time) -> int:
    """The first of `candidates` that no other caller reserved in the last `RESERVED_S`
    seconds and that binds on 0.0.0.0 (it conflicts with a bind to any local address),
    reserved from now on."""
    PORT_RESERVATIONS.mkdir(exist_ok=True)
    with (PORT_RESERVATIONS / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released with the file
        for port in candidates:
            reservation = PORT_RESERVATIONS / str(port)
            with contextlib.suppress(FileNotFoundError):
                if now() - reservation.stat().st_mtime < RESERVED_S:
                    continue
            if not _binds(port):
                continue
            reservation.write_text(f"{os.getpid()}\n")
            os.utime(reservation, (now(), now()))
            return port
    raise RuntimeError(
        f"no free TCP port among {len(candidates)} candidates (each bound, or handed out in the "
        f"last {RESERVED_S:g} s: {PORT_RESERVATIONS})"
    )


def _binds(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a process has used so far (/proc/<pid>/stat, fields 14-15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    return sum(cpu_times(pid))


def children(pid: int) -> list[int]:
    """The processes `pid` started, from any of its threads (none once it has ended). Linux:
    reads /proc."""
    try:
        tasks = sorted(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:  # it has ended
        return []
    found: list[int] = []
    for task in tasks:
        try:
            found += map(int, (task / "children").read_text().split())
        except FileNotFoundError:  # that thread has just ended
            continue
    return found


def spawned_children(pid: int) -> list[int]:
    """The processes `pid` started with multiprocessing's spawn method, from any of its
    threads (its resource tracker is another child, left out). Linux: reads /proc."""
    found = []
    for child in children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as cmdline:
                if b"spawn_main" in cmdline.read():
                    found.append(child)
        except FileNotFoundError:  # that child has just ended
            continue
    return found


def spawned_child(pid: int) -> int | None:
    """The first of `spawned_children(pid)`, if it has one yet."""
    return next(iter(spawned_children(pid)), None)


def wait_for(
    what: str,
    check: Callable[[], T | None],
    timeout: float,
    *,
    interval: float = 0.2,
    process: ManagedProcess | None = None,
) -> T:
    """Poll ``check()`` until it returns truthy and return that value; fail early if
    ``process`` dies.

    Raises :class:`TimeoutError` (or :class:`RuntimeError` if the process exited) with the
    tail of the process log in the message.
    """
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # the component is still coming up
            last_error = f"{type(exc).__name__}: {exc}"
        if process is not None and not process.alive():
            raise RuntimeError(
                f"{process.name} exited with code {process.popen.returncode} while waiting for"
                f" {what}; log {process.log_path}:\n{process.log_tail()}"
            )
        if time.monotonic() > deadline:
            tail = f"\nlog {process.log_path}:\n{process.log_tail()}" if process else ""
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}: {last_error}{tail}"
            )
        time.sleep(interval)


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (Ctrl-C), for a command that runs until told to stop."""
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop
