"""The weights fetcher against the stand-in Hub (a local test double, never the internet).

Each case runs the Job's real entry point (`python -m dsv4_operator.weights`) as a process
with the env the operator renders, so exit codes and the termination message are what a
pod would show.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4_devcluster import wait_for
from dsv4_devcluster.hub import HubRepo, StandInHub
from dsv4_operator.weights.fetch import FetchError, FetchRequest, make_plan, verify_snapshot
from dsv4_operator.weights.progress import FailureReason, WeightsProgress

REPO_ID = "example-org/tiny-dsv4"
TOKEN = "hf_stand_in_token"
# Larger than huggingface_hub's 10 MiB read chunk, so a part of it reaches the disk before
# the stall (the downloader writes whole chunks).
BIG = 24 << 20


def _files() -> dict[str, bytes]:
    return {
        "config.json": b'{"architectures": ["DeepseekV4ForCausalLM"]}',
        "tokenizer.json": b"t" * 5000,
        "model-00001-of-00002.safetensors": os.urandom(BIG),
        "model-00002-of-00002.safetensors": os.urandom(300_000),
    }


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    repos = {
        REPO_ID: HubRepo(_files(), revisions=("main", "v1")),
        "example-org/gated": HubRepo({"config.json": b"{}"}, token=TOKEN),
    }
    with StandInHub(repos) as server:
        yield server


def _env(hub: StandInHub, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "DSV4_"))}
    env.update(
        HF_HOME=str(home),
        HF_ENDPOINT=hub.endpoint,
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        DSV4_WEIGHTS_REPO=REPO_ID,
        DSV4_WEIGHTS_REVISION="main",
        DSV4_WEIGHTS_INTERVAL="0.2",
        DSV4_TERMINATION_LOG=str(home / "termination-log"),
    )
    env.update(extra)
    return env


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsv4_operator.weights"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _snapshot(home: Path, commit: str) -> Path:
    return home / "hub" / "models--example-org--tiny-dsv4" / "snapshots" / commit


def test_a_snapshot_is_downloaded_verified_and_left_where_the_engine_looks(
    hub: StandInHub, tmp_path: Path
) -> None:
    done = _run(_env(hub, tmp_path))
    assert done.returncode == 0, done.stderr
    repo = hub.repos[REPO_ID]
    snapshot = _snapshot(tmp_path, repo.commit)
    for name, data in repo.files.items():
        assert (snapshot / name).read_bytes() == data
    # The engine runs offline with --revision main: the ref must name the commit.
    ref = tmp_path / "hub" / "models--example-org--tiny-dsv4" / "refs" / "main"
    assert ref.read_text() == repo.commit
    total = sum(len(d) for d in repo.files.values())
    mib = f"{total / (1 << 20):.1f}"
    assert (tmp_path / "termination-log").read_text() == (
        f"Complete: 4/4 files, {mib}/{mib} MiB at {repo.commit}"
    )


@pytest.mark.parametrize(
    ("extra", "reason", "words"),
    [
        ({"DSV4_WEIGHTS_REPO": "example-org/missing"}, FailureReason.NOT_FOUND, "check spec.model"),
        ({"DSV4_WEIGHTS_REVISION": "v9"}, FailureReason.NOT_FOUND, "revision 'v9' not found"),
        ({"DSV4_WEIGHTS_REPO": "example-org/gated"}, FailureReason.UNAUTHORIZED, "tokenSecret"),
    ],
)
def test_a_failure_exits_with_its_reason_and_says_what_to_fix(
    hub: StandInHub, tmp_path: Path, extra: dict[str, str], reason: FailureReason, words: str
) -> None:
    done = _run(_env(hub, tmp_path, **extra))
    assert done.returncode == reason.exit_code, done.stderr
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith(f"{reason.reason}: ")
    assert words in message


def test_a_token_opens_a_gated_repo(hub: StandInHub, tmp_path: Path) -> None:
    env = _env(hub, tmp_path, DSV4_WEIGHTS_REPO="example-org/gated", HF_TOKEN=TOKEN)
    done = _run(env)
    assert done.returncode == 0, done.stderr


def test_the_container_logs_files_bytes_and_resumption_never_the_token(
    hub: StandInHub, tmp_path: Path
) -> None:
    """What `kubectl logs` shows of a download Job: the plan, each file with its bytes, a
    resumed attempt, the verification; the token not once (main logged only `size not known
    yet` and the phases)."""
    env = _env(hub, tmp_path, HF_TOKEN=TOKEN)
    done = _run(env)
    assert done.returncode == 0, done.stderr
    log = done.stdout + done.stderr
    assert "4 files, " in log and "0 files and 0 bytes already on disk" in log
    assert f"model-00001-of-00002.safetensors: downloading {BIG} bytes" in log
    assert f"model-00001-of-00002.safetensors: done ({BIG} bytes)" in log
    assert "verifying 4 files (Checksum)" in log and "with a token" in log
    assert TOKEN not in log
    again = _run(env)  # everything on disk: nothing downloads again, and the log says so
    assert again.returncode == 0 and "4 files and" in again.stderr
    assert "(resuming an earlier attempt)" in again.stderr and TOKEN not in again.stderr


def test_a_volume_too_small_is_refused_before_downloading(hub: StandInHub, tmp_path: Path) -> None:
    # A free-space figure below the repo's size: the fetcher must refuse up front. The file
    # system's real free space is far larger, so the repo is made larger than it instead:
    # larger than the whole file system, since other tests write and delete beside this one
    # (free space read here, then again by check_room, once grew past free + 1 in CI).
    whole = shutil.disk_usage(tmp_path).total
    repo = hub.repos[REPO_ID]
    request = FetchRequest(REPO_ID, "main", tmp_path / "hub", endpoint=hub.endpoint)
    from huggingface_hub import HfApi

    from dsv4_operator.weights.fetch import PlannedFile, WeightsPlan, check_room

    plan = make_plan(HfApi(endpoint=hub.endpoint), request)
    assert plan.commit == repo.commit
    assert plan.total_bytes == sum(len(d) for d in repo.files.values())
    huge = WeightsPlan(
        plan.commit, (*plan.files, PlannedFile("shard.safetensors", whole + 1, "x", None))
    )
    with pytest.raises(FetchError) as err:
        check_room(request, huge, present=0)
    assert err.value.reason is FailureReason.DISK_FULL
    assert "raise spec.model.cache.huggingFace.storage" in err.value.message
    assert not any(r[0] == "SENT" for r in hub.log.requests)


def test_a_killed_download_resumes_where_it_stopped(hub: StandInHub, tmp_path: Path) -> None:
    shard = "model-00001-of-00002.safetensors"
    hub.stall_after(shard, 12 << 20)
    env = _env(hub, tmp_path)
    first = subprocess.Popen(
        [sys.executable, "-m", "dsv4_operator.weights"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    blobs = tmp_path / "hub" / "models--example-org--tiny-dsv4" / "blobs"
    etag = hashlib.sha256(hub.repos[REPO_ID].files[shard]).hexdigest()
    part = blobs / f"{etag}.dsv4-partial"

    def partial_written() -> bool:
        assert first.poll() is None, "the downloader ended before the stall"
        return part.is_file() and part.stat().st_size >= 10 << 20

    wait_for("10 MiB of the partial file", partial_written, 60, interval=0.05)
    first.send_signal(signal.SIGKILL)  # the pod dies mid-file
    first.wait()
    kept = part.stat().st_size
    hub.release()

    second = _run(env)
    assert second.returncode == 0, second.stderr
    ranges = [r[2] for r in hub.log.requests if r[0] == "GET" and r[1].endswith(shard)]
    assert ranges[-1] == f"bytes={kept}-"
    # Sent once in full plus the resumed tail only, not twice.
    assert hub.log.bytes_sent[shard] <= BIG + (12 << 20)
    snapshot = _snapshot(tmp_path, hub.repos[REPO_ID].commit)
    assert (snapshot / shard).read_bytes() == hub.repos[REPO_ID].files[shard]


def test_a_corrupt_shard_fails_verification(hub: StandInHub, tmp_path: Path) -> None:
    assert _run(_env(hub, tmp_path)).returncode == 0
    repo = hub.repos[REPO_ID]
    request = FetchRequest(REPO_ID, "main", tmp_path / "hub", endpoint=hub.endpoint)
    from huggingface_hub import HfApi

    plan = make_plan(HfApi(endpoint=hub.endpoint), request)
    snapshot = _snapshot(tmp_path, repo.commit)
    shard = snapshot / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.resolve().write_bytes(bytes(data))
    verify_snapshot(snapshot, plan, "Size")  # same size: only a checksum sees it
    with pytest.raises(FetchError) as err:
        verify_snapshot(snapshot, plan, "Checksum")
    assert err.value.reason is FailureReason.VERIFY_FAILED
    assert "model-00002-of-00002.safetensors: sha256" in err.value.message


def test_progress_round_trips_through_the_annotation() -> None:
    report = WeightsProgress(
        phase="Downloading",
        repo=REPO_ID,
        revision="main",
        files_done=3,
        files_total=170,
        bytes_done=12 << 30,
        bytes_total=700 << 30,
    )
    assert WeightsProgress.from_annotation(report.to_annotation()) == report
    assert report.summary() == "3/170 files, 12.0/700.0 GiB"
    small = report.model_copy(update={"bytes_done": 3 << 20, "bytes_total": 300 << 20})
    assert small.summary() == "3/170 files, 3.0/300.0 MiB"
    assert WeightsProgress.from_annotation("{not json") is None


def _lock_waiter(inode: int) -> bool:
    """Whether some process waits for a lock on the file with this inode."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and fields[fields.index("->") + 5].endswith(f":{inode}"):
            return True
    return False


def test_two_downloads_into_one_claim_take_turns_on_a_blob(hub: StandInHub, tmp_path: Path) -> None:
    """A pod still terminating, or another revision's Job sharing a blob, appends to the same
    partial file: the second waits for the first and then finds the blob done."""
    import threading

    from huggingface_hub import HfApi

    from dsv4_operator.weights.fetch import download_blobs

    shard = "model-00001-of-00002.safetensors"
    request = FetchRequest(REPO_ID, "main", tmp_path / "hub", endpoint=hub.endpoint)
    plan = make_plan(HfApi(endpoint=hub.endpoint), request)
    hub.stall_after(shard, 12 << 20)
    first = threading.Thread(target=download_blobs, args=(request, plan))
    first.start()
    part = tmp_path / "hub" / "models--example-org--tiny-dsv4" / "blobs"
    etag = hashlib.sha256(hub.repos[REPO_ID].files[shard]).hexdigest()
    wait_for("the partial file", (part / f"{etag}.dsv4-partial").is_file, 60, interval=0.05)
    inode = (part / f"{etag}.dsv4-partial").stat().st_ino
    second = threading.Thread(target=download_blobs, args=(request, plan))
    second.start()
    # Release the first only once the second is blocked on the partial file's lock (the
    # kernel lists a waiter as `->` in /proc/locks): the contention is certain, not timed.

    def second_waits() -> bool:
        assert second.is_alive(), "the second download ended without waiting for the lock"
        return _lock_waiter(inode)

    wait_for("the second download to wait on the lock", second_waits, 60, interval=0.05)
    hub.release()
    first.join(60)
    second.join(60)
    assert not first.is_alive() and not second.is_alive()
    assert (part / etag).read_bytes() == hub.repos[REPO_ID].files[shard]
    assert hub.log.bytes_sent[shard] == BIG  # fetched once, not appended twice
