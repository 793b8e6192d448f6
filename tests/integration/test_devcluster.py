"""The harness itself: its pins match the build script, and every way of stopping it (context
exit, SIGTERM, Ctrl-C, even SIGKILL of the owner) leaves no process or temp dir behind."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dsv4_devcluster import K8S_VERSION, ControlPlane, wait_for
from dsv4_devcluster.binaries import LWS_VERSION
from dsv4_devcluster.controlplane import _sweep_stale_data_dirs

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (the data dir path is in every component's)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(("name", "pinned"), [("K8S", K8S_VERSION), ("LWS", LWS_VERSION)])
def test_build_script_pins_the_version_the_harness_looks_for(name: str, pinned: str) -> None:
    script = (REPO_ROOT / "tools" / "build-k8s.sh").read_text()
    match = re.search(rf'{name}_VERSION="\$\{{DSV4_{name}_VERSION:-(v[0-9.]+)\}}"', script)
    assert match, f"{name}_VERSION default not found in tools/build-k8s.sh"
    assert match.group(1) == pinned


def test_build_script_reports_its_step_and_elapsed_time_while_it_waits(tmp_path: Path) -> None:
    """A first `make demo` builds for minutes: the script says what it is doing, and for how
    long, on a clock (here: while another build holds the lock), not once per phase."""
    out = tmp_path / "v1.37.2"
    out.mkdir()
    env = {**os.environ, "DSV4_K8S_CACHE": str(tmp_path), "DSV4_K8S_PROGRESS_SECONDS": "1",
           "DSV4_K8S_VERSION": "v1.37.2", "TMPDIR": str(tmp_path)}  # fmt: skip
    env.pop("KUBEBUILDER_ASSETS", None)
    with (out / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build, as the script sees it
        script = subprocess.Popen(
            ["bash", str(REPO_ROOT / "tools" / "build-k8s.sh")], start_new_session=True,
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert script.stderr is not None

        def end() -> None:  # the whole group: a child (flock, sleep) holds stderr open too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(script.pid, signal.SIGTERM)

        stop = threading.Timer(10, end)  # a silent script ends the reading too
        stop.start()
        lines = [script.stderr.readline() for _ in range(4)]
        stop.cancel()
        end()
        script.wait(10)
    assert "waiting for another build" in lines[0], lines
    ticks = [line for line in lines[1:] if "waiting for another build" in line]
    elapsed = [int(m[1]) for line in ticks if (m := re.search(r"; (\d+) s elapsed$", line))]
    assert len(elapsed) == 3 and elapsed == sorted(elapsed) and elapsed[-1] >= 2, lines
    wait_for("the ticker gone", lambda: not list(tmp_path.glob("dsv4-build-k8s-step.*")), 10)


def test_context_exit_stops_everything(control_plane: ControlPlane) -> None:
    with ControlPlane() as cp:  # a second, minimal one next to the session's
        data_dir = cp.data_dir
        names = {p.name for p in cp.processes}
        assert names == {"etcd", "kube-apiserver", "kube-controller-manager"}
        assert len(processes_mentioning(str(data_dir))) == 3
    assert processes_mentioning(str(data_dir)) == []
    assert not data_dir.exists()
    assert control_plane.processes and all(p.alive() for p in control_plane.processes)


def start_cli(*args: str) -> tuple[subprocess.Popen[str], Path]:
    """``python -m dsv4_devcluster ARGS`` until it is ready; return it and its dir."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsv4_devcluster", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("kubeconfig: "):
            data_dir = Path(line.split(": ", 1)[1].strip()).parent
            break
        assert time.monotonic() < deadline, "".join(lines)
    else:
        pytest.fail("devcluster CLI exited early:\n" + "".join(lines))
    for line in proc.stdout:
        if line.startswith("Ctrl-C"):
            return proc, data_dir
    pytest.fail("devcluster CLI never became ready:\n" + "".join(lines))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_stops_everything_on_signal(sig: signal.Signals) -> None:
    proc, data_dir = start_cli("--minimal")
    assert len(processes_mentioning(str(data_dir))) == 3
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 0
    assert processes_mentioning(str(data_dir)) == []
    assert not data_dir.exists()


def test_sigkill_of_owner_takes_children_down_and_dir_is_swept() -> None:
    proc, data_dir = start_cli("--minimal")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(
        "components to die with their owner (PR_SET_PDEATHSIG)",
        lambda: processes_mentioning(str(data_dir)) == [],
        timeout=30,
    )
    assert data_dir.exists()  # nobody could clean up after SIGKILL ...
    _sweep_stale_data_dirs()  # ... so the next start does
    assert not data_dir.exists()


def test_cli_lws_option_runs_the_lws_controller_and_stops_it_with_the_plane() -> None:
    proc, data_dir = start_cli("--minimal", "--lws")
    logs = data_dir / "logs"
    assert (logs / "lws-controller-manager.log").is_file()
    # etcd, kube-apiserver, kube-controller-manager and the LWS manager (its --config is there)
    assert len(processes_mentioning(str(data_dir))) == 4
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert processes_mentioning(str(data_dir)) == []
    assert not data_dir.exists()
