"""Download a Hugging Face snapshot into the shared cache, resumably, and verify it.

Plan (the Hub's file list: count and bytes known before a byte is fetched), check the volume
has room, download each file's blob into the cache with ``huggingface_hub``'s ``http_get``
from a ``.dsv4-partial`` file that survives the pod (``snapshot_download`` alone restarts a
file from zero in a new process: its temporary files are per process), then let
``snapshot_download`` link the cached blobs into the snapshot and write the revision's ref,
and verify every file's size, and the sha256 of every LFS file (the weights) when asked.
Progress goes to a :class:`Reporter` every few seconds; failures become :class:`FetchError` with a
:class:`~.progress.FailureReason`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import hf_hub_url, http_get, repo_folder_name
from huggingface_hub.hf_api import RepoFile

# Public (documented) name; the package's lazy __init__ hides it from mypy.
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

from dsv4_operator.weights.progress import FailureReason, WeightsProgress

# What the container logs: the plan, each file (resumed from where, done), the verification,
# the failure. Never the token (only huggingface_hub's headers carry it; none is logged here).
log = logging.getLogger(__name__)

Verify = Literal["Size", "Checksum"]
_HASH_CHUNK = 8 << 20
PARTIAL_SUFFIX = ".dsv4-partial"


class Reporter(Protocol):
    def report(self, progress: WeightsProgress) -> None: ...


class FetchError(Exception):
    """A failed fetch: why (the reason names the exit code) and what to do."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class FetchRequest:
    repo: str
    revision: str
    cache_dir: Path  # HF_HUB_CACHE: <HF_HOME>/hub
    endpoint: str | None = None
    token: str | None = None
    verify: Verify = "Checksum"


@dataclass(frozen=True)
class PlannedFile:
    path: str
    size: int
    etag: str  # the blob's name in the cache: the LFS sha256, else the git blob id
    sha256: str | None


@dataclass(frozen=True)
class WeightsPlan:
    """The Hub's file list of one commit: what to download and verify, known up front."""

    commit: str
    files: tuple[PlannedFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def classify(exc: BaseException, request: FetchRequest) -> FetchError:
    """The FetchError for an exception raised while talking to the Hub or writing the cache."""
    where = f"{request.repo}@{request.revision}"
    if isinstance(exc, FetchError):
        return exc
    if isinstance(exc, RevisionNotFoundError):
        return FetchError(
            FailureReason.NOT_FOUND,
            f"404: revision {request.revision!r} not found in {request.repo}: "
            "fix spec.model.cache.huggingFace.revision (a DSV4Model's spec.revision)",
        )
    if isinstance(exc, EntryNotFoundError):
        return FetchError(FailureReason.NOT_FOUND, f"404: a file of {where} is gone: {exc}")
    if isinstance(exc, GatedRepoError) or (
        isinstance(exc, HfHubHTTPError)
        and exc.response is not None
        and exc.response.status_code in (401, 403)
    ):
        status = exc.response.status_code if isinstance(exc, HfHubHTTPError) else 401
        return FetchError(
            FailureReason.UNAUTHORIZED,
            f"{status}: the Hub refused access to {request.repo} (gated or private): set "
            "spec.model.cache.huggingFace.tokenSecret (a DSV4Model's spec.tokenSecret) to a "
            "Secret holding a token that may read it",
        )
    if isinstance(exc, RepositoryNotFoundError):
        return FetchError(
            FailureReason.NOT_FOUND,
            f"404: repository {request.repo} not found (or private without a token): check "
            "spec.model.name (a DSV4Model's spec.repo)",
        )
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return FetchError(
            FailureReason.DISK_FULL,
            f"the weights volume is full while downloading {where}: raise "
            "spec.model.cache.huggingFace.storage (a DSV4Model's spec.storage)",
        )
    # Anything else (connection, timeout, 5xx, a dropped stream) may pass: the Job retries it,
    # and the next pod resumes.
    return FetchError(FailureReason.HUB_UNAVAILABLE, f"{type(exc).__name__}: {exc}".splitlines()[0])


def make_plan(api: HfApi, request: FetchRequest) -> WeightsPlan:
    """The commit the revision names and its files, as the Hub lists them."""
    info = api.model_info(request.repo, revision=request.revision)
    if info.sha is None:
        raise FetchError(FailureReason.HUB_UNAVAILABLE, "the Hub returned no commit")
    files = tuple(
        PlannedFile(
            path=item.path,
            size=item.lfs.size if item.lfs is not None else item.size,
            etag=item.lfs.sha256 if item.lfs is not None else item.blob_id,
            sha256=item.lfs.sha256 if item.lfs is not None else None,
        )
        for item in api.list_repo_tree(request.repo, recursive=True, revision=info.sha)
        if isinstance(item, RepoFile)
    )
    return WeightsPlan(commit=info.sha, files=files)


def storage_folder(request: FetchRequest) -> Path:
    return request.cache_dir / repo_folder_name(repo_id=request.repo, repo_type="model")


def on_disk(request: FetchRequest, plan: WeightsPlan) -> tuple[int, int]:
    """(files complete, bytes present): complete blobs plus the partial files' bytes."""
    blobs = storage_folder(request) / "blobs"
    files_done = bytes_done = 0
    for item in plan.files:
        blob = blobs / item.etag
        if blob.is_file():
            files_done += 1
            bytes_done += item.size
            continue
        part = blobs / f"{item.etag}{PARTIAL_SUFFIX}"
        if part.is_file():
            bytes_done += min(part.stat().st_size, item.size)
    return files_done, bytes_done


def check_room(request: FetchRequest, plan: WeightsPlan, present: int) -> None:
    """Refuse up front when the volume cannot hold what is left to download."""
    request.cache_dir.mkdir(parents=True, exist_ok=True)
    needed = plan.total_bytes - present
    free = shutil.disk_usage(request.cache_dir).free
    if needed > free:
        raise FetchError(
            FailureReason.DISK_FULL,
            f"{request.repo}@{request.revision} needs {needed / (1 << 30):.2f} GiB more but "
            f"the weights volume has {free / (1 << 30):.2f} GiB free: raise "
            "spec.model.cache.huggingFace.storage (a DSV4Model's spec.storage) or free the volume",
        )


def download_blobs(request: FetchRequest, plan: WeightsPlan, workers: int = 8) -> None:
    """Each missing blob, appended to its partial file from where that stops, then renamed."""
    blobs = storage_folder(request) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    headers = build_hf_headers(token=request.token)

    def one(item: PlannedFile) -> None:
        blob = blobs / item.etag
        if blob.is_file():
            return
        part = blobs / f"{item.etag}{PARTIAL_SUFFIX}"
        url = hf_hub_url(request.repo, item.path, revision=plan.commit, endpoint=request.endpoint)
        with part.open("ab") as handle:
            # Another download into the same claim (a pod still terminating, another
            # revision's Job sharing this blob) appends to the same part: one at a time.
            fcntl.flock(handle, fcntl.LOCK_EX)
            if blob.is_file():  # the other one finished it meanwhile
                return
            have = handle.tell()
            if have > item.size:  # not this blob's bytes: start over
                log.info(
                    "%s: %d bytes on disk are more than its %d: starting over",
                    item.path,
                    have,
                    item.size,
                )
                handle.truncate(0)
                have = 0
            if have:
                log.info("%s: resuming at byte %d of %d", item.path, have, item.size)
            else:
                log.info("%s: downloading %d bytes", item.path, item.size)
            if have < item.size:
                http_get(
                    url,
                    handle,
                    resume_size=have,
                    headers=headers,
                    expected_size=item.size,
                    displayed_filename=item.path,
                )
            part.replace(blob)  # under the lock: a waiting writer then sees the blob
            log.info("%s: done (%d bytes)", item.path, item.size)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, plan.files))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_snapshot(snapshot: Path, plan: WeightsPlan, verify: Verify) -> None:
    """Every planned file is there with its size; LFS files hash to their sha256 if asked."""
    for item in plan.files:
        path = snapshot / item.path
        if not path.is_file() or path.stat().st_size != item.size:
            have = path.stat().st_size if path.is_file() else "missing"
            raise FetchError(
                FailureReason.VERIFY_FAILED,
                f"{item.path}: expected {item.size} bytes, found {have}",
            )
    if verify != "Checksum":
        return
    hashed = [item for item in plan.files if item.sha256 is not None]
    # hashlib releases the GIL on large updates: threads hash several shards at once.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(lambda f: _sha256(snapshot / f.path), hashed))
    for item, digest in zip(hashed, digests, strict=True):
        if digest != item.sha256:
            raise FetchError(
                FailureReason.VERIFY_FAILED,
                f"{item.path}: sha256 {digest} does not match the Hub's {item.sha256}",
            )


class _Ticker:
    """Reports on-disk progress every `interval` seconds from a background thread."""

    def __init__(self, interval: float, tick: Callable[[], None]) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval, tick), daemon=True)

    def _run(self, interval: float, tick: Callable[[], None]) -> None:
        while not self._stop.wait(interval):
            tick()

    def __enter__(self) -> _Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def fetch(request: FetchRequest, reporter: Reporter, interval: float = 5.0) -> WeightsProgress:
    """Download and verify; the final report (Complete). Raises FetchError."""
    base = WeightsProgress(phase="Planning", repo=request.repo, revision=request.revision)
    reporter.report(base)
    api = HfApi(endpoint=request.endpoint, token=request.token)
    try:
        plan = make_plan(api, request)
        files_present, bytes_present = on_disk(request, plan)
        log.info(
            "%s@%s is commit %s: %d files, %d bytes; %d files and %d bytes already on disk%s",
            request.repo,
            request.revision,
            plan.commit,
            len(plan.files),
            plan.total_bytes,
            files_present,
            bytes_present,
            " (resuming an earlier attempt)" if bytes_present else "",
        )
        check_room(request, plan, bytes_present)
        known = base.model_copy(
            update={
                "commit": plan.commit,
                "files_total": len(plan.files),
                "bytes_total": plan.total_bytes,
            }
        )

        def tick() -> None:
            done_files, done_bytes = on_disk(request, plan)
            reporter.report(
                known.model_copy(
                    update={
                        "phase": "Downloading",
                        "files_done": done_files,
                        "bytes_done": done_bytes,
                    }
                )
            )

        tick()
        with _Ticker(interval, tick):
            download_blobs(request, plan)
            snapshot = Path(
                str(
                    snapshot_download(
                        request.repo,
                        revision=request.revision,
                        cache_dir=request.cache_dir,
                        endpoint=request.endpoint,
                        token=request.token,
                    )
                )
            )
        if snapshot.name != plan.commit:  # the branch moved meanwhile: verify what we got
            plan = make_plan(api, FetchRequest(**{**request.__dict__, "revision": snapshot.name}))
        done = known.model_copy(
            update={
                "phase": "Verifying",
                "commit": plan.commit,
                "files_total": len(plan.files),
                "files_done": len(plan.files),
                "bytes_total": plan.total_bytes,
                "bytes_done": plan.total_bytes,
            }
        )
        reporter.report(done)
        log.info("verifying %d files (%s)", len(plan.files), request.verify)
        verify_snapshot(snapshot, plan, request.verify)
    except Exception as exc:  # every failure is classified and reported
        raise classify(exc, request) from exc
    final = done.model_copy(update={"phase": "Complete", "message": f"verified ({request.verify})"})
    reporter.report(final)
    return final
