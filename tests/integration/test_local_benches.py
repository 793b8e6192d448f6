"""The benchmarks still run: each script under bench/ that needs no control plane, at a size
that takes seconds, must finish and print its figures (their values are for people to read,
not asserted here). The ones that start a control plane: tests/integration/test_benches.py."""

from __future__ import annotations

import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4_devcluster.process import children
from tests.support.benches import BENCH, run_bench


def test_the_detector_bench_runs_and_finds_every_verdict_as_expected() -> None:
    out = run_bench("detector.py", "--responses", "200", "--repeat", "1")
    assert re.search(r"detector throughput: [\d,]+ classifications/s", out)
    assert re.search(r"2-20 KB assistant messages .*: [\d,]+ classifications/s, [\d.]+ MB/s", out)
    # The same run's floor, one combined regex over the same JSON, and the ratio to it.
    assert len(re.findall(r"regex floor.*?[\d.]+ MB/s; detector/regex [\d.]+", out)) == 2
    assert "verdicts different from expected: 0" in out


def test_the_cli_start_bench_times_the_commands_and_names_their_imports() -> None:
    out = run_bench("cli_start.py", "--runs", "1", "--top", "3")
    for command in ("python -c pass", "dsv4 validate", "dsv4 plan"):
        assert re.search(rf"{re.escape(command)} +best [\d.]+ s, median [\d.]+ s", out), out
    for command in ("validate", "plan"):
        assert f"cli {command}: " in out
    assert out.count("heavy packages loaded: none") == 2, out


def test_the_http_client_bench_reads_through_every_client() -> None:
    out = run_bench("http_client.py", "--requests", "40", "--in-flight", "1", "4", "--rounds", "1")
    for client in (
        "httpx, kept connections",
        "guard, kept connections (canary)",
        "guard, no kept connection (pod pages)",
    ):
        assert re.search(rf"\n{re.escape(client)} +[\d.]+ +[\d.]+\n", out), out


def test_the_guard_bench_runs_both_deciders() -> None:
    out = run_bench(
        "guard.py", "--trials", "40", "--decisions", "2000", "--points", "7200", "--seed", "3"
    )
    for rate in ("17.00%", "4.55%"):
        assert re.search(rf"{re.escape(rate)} leak rate: responses to rollback decision", out)
    rollbacks = re.findall(r"\n  (.+?): 4\.55% leak rate: rollback after median \d+s", out)
    assert len(rollbacks) >= 2, out  # repeated Wilson looks and the mixture SPRT
    assert len(re.findall(r"0\.5% leak rate: \d+ false rollbacks in 7200", out)) == len(rollbacks)
    # The silent drop: what the canary alone, with the tap, and with the engines' counter take.
    assert "silent tool-call drops at 4.55% of responses" in out
    for sources in ("canary alone", "canary + tap", "canary + engine counter + tap"):
        assert re.search(rf"\n  {re.escape(sources)} +\d+ +\d+ +\d+\n", out), out


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_tap_bench_runs_both_timings_through_a_real_tap(workers: str) -> None:
    out = run_bench(
        "tap.py",
        *("--seconds", "1", "--warmup", "0.2", "--sessions", "1,4", "--rounds", "1"),
        *("--chunks", "4", "--no-pin", "--tap-workers", workers),
    )
    assert out.count("added by the tap (tap - direct") == 2  # steps and streams
    for sessions in (1, 4):
        # A figure, or nan if a window caught no request (never a crash).
        assert len(re.findall(rf"\n +{sessions}  request p50 [+-](\d|nan)", out)) == 2, out
    throughput = re.search(r"= (\d+) requests/s per core .* classified (\d+), dropped (\d+)", out)
    assert throughput is not None, out
    assert int(throughput[1]) > 0
    assert int(throughput[2]) + int(throughput[3]) > 0  # the classifier was fed copies


def test_the_tap_bench_measures_a_relay_given_as_a_command_in_the_taps_place() -> None:
    # The command form (how the native relay probe is measured), run here with the tap itself.
    command = (
        "{python} -m dsv4_operator.cli tap --upstream http://{upstream} --listen {listen} "
        "--metrics {metrics} --deployment bench"
    )
    out = run_bench(
        "tap.py",
        *("--seconds", "1", "--warmup", "0.2", "--sessions", "1,4", "--rounds", "1"),
        *("--chunks", "4", "--no-pin", "--timing", "steps", "--tap-command", command),
    )
    assert out.count("added by the tap (tap - direct") == 1
    rows = re.findall(r"\n +4  tap +\d+ .* tap [\d.]+ .* classifier ([\d.]+)", out)
    assert len(rows) == 1, out  # its classifier found among the command's children
    throughput = re.search(r"classified (\d+), dropped (\d+)", out)
    assert throughput is not None and int(throughput[1]) + int(throughput[2]) > 0, out


def _descendants(pid: int) -> set[int]:
    """Every process under `pid`."""
    return {p for child in children(pid) for p in {child, *_descendants(child)}}


def test_the_tap_bench_stopped_midway_ends_the_tap_and_upstream_it_started(
    tmp_path: Path,
) -> None:
    """Left running, a stopped bench's tap, classifier and upstream would hold their ports
    and CPU through the runs that follow, and skew them."""
    args = ["--seconds", "600", "--sessions", "1", "--rounds", "1", "--chunks", "4"]
    # Its first line comes once the upstream, the tap and its classifier all run.
    started = _stopped_midway(
        ["tap.py", *args, "--no-pin", "--timing", "steps"], b"cores", tmp_path
    )
    assert len(started) >= 3, started  # upstream, tap, classifier (and helpers)


def test_the_http_client_bench_stopped_midway_ends_its_server(tmp_path: Path) -> None:
    started = _stopped_midway(["http_client.py", "--requests", "10000000"], b"measuring", tmp_path)
    assert len(started) == 1, started  # the HTTP server it reads


def _stopped_midway(argv: list[str], ready: bytes, tmp_path: Path) -> set[int]:
    """Run the bench `argv` until its output has a line with `ready`, stop it with SIGTERM,
    and check that it exits 143 soon and leaves none of its processes running: the processes
    it had started, returned."""
    errors = tmp_path / "stderr"
    with errors.open("wb") as stderr:
        bench = subprocess.Popen(
            [sys.executable, str(BENCH / argv[0]), *argv[1:]],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    assert bench.stdout is not None
    try:
        readable, _, _ = select.select([bench.stdout], [], [], 60)
        assert readable and ready in bench.stdout.readline(), errors.read_text()
        started = _descendants(bench.pid)
        bench.send_signal(signal.SIGTERM)
        try:
            exited = bench.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within 30 s of SIGTERM; its stderr:\n{errors.read_text()}")
        assert exited == 128 + signal.SIGTERM, errors.read_text()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    deadline = time.monotonic() + 15
    while (left := {p for p in started if _running(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running after the bench was stopped: {sorted(left)}"
    return started


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
