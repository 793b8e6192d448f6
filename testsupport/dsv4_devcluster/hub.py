"""A stand-in for the Hugging Face Hub's download API, on loopback: a TEST DOUBLE, not the Hub.

It serves the few endpoints ``huggingface_hub.snapshot_download`` calls (``HF_ENDPOINT`` points
it here), with the Hub's headers and error codes, so the weights fetcher runs unchanged against
it and no test touches the internet:

* ``GET /api/models/<repo>/revision/<rev>``: the commit a revision resolves to;
* ``GET /api/models/<repo>/tree/<rev>?recursive=...``: the file list with sizes (LFS files carry
  their sha256 and size, as on the Hub);
* ``HEAD|GET /<repo>/resolve/<rev>/<path>``: a file, with ``X-Repo-Commit``, ``ETag`` /
  ``X-Linked-Etag``, ``X-Linked-Size`` and ``Range`` support (what makes a download resumable).

Failures on demand: a repo that needs a token (401 without it, like a gated or private repo),
an unknown repo or revision (404 with ``X-Error-Code``), and :meth:`StandInHub.stall_after` to
hold a file part-way through (so a test can kill the downloader there: an interrupted pod).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

#: Files at least this large are stored "in LFS" (etag = sha256), as the Hub does for weights.
LFS_THRESHOLD = 1024


@dataclass
class HubRepo:
    """One model repo: its files at one commit, the revisions naming it, an optional token."""

    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    revisions: tuple[str, ...] = ("main",)
    token: str | None = None

    def entry(self, path: str) -> dict[str, Any]:
        data = self.files[path]
        git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        item: dict[str, Any] = {"type": "file", "oid": git_oid, "size": len(data), "path": path}
        if len(data) >= LFS_THRESHOLD:
            sha = hashlib.sha256(data).hexdigest()
            item["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
        return item

    def etag(self, path: str) -> str:
        item = self.entry(path)
        return str(item["lfs"]["oid"] if "lfs" in item else item["oid"])


@dataclass
class HubLog:
    """What the stand-in served: requests (method, path, Range header) and file bytes sent."""

    requests: list[tuple[str, str, str]] = field(default_factory=list)
    bytes_sent: dict[str, int] = field(default_factory=dict)


class StandInHub:
    """``with StandInHub({"org/model": HubRepo(files)}) as hub: hub.endpoint``."""

    def __init__(self, repos: dict[str, HubRepo], port: int = 0) -> None:
        self.repos = repos
        self.log = HubLog()
        self._stalls: dict[str, int] = {}
        self._released = threading.Event()
        self._lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            owner = hub

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stall_after(self, path: str, after_bytes: int) -> None:
        """Send ``after_bytes`` of ``path`` in the next response for it, then hold that response
        until :meth:`release` (later requests are served whole)."""
        with self._lock:
            self._stalls[path] = after_bytes
            self._released.clear()

    def release(self) -> None:
        """End every stall: held responses go on, later ones are served whole."""
        with self._lock:
            self._stalls.clear()
            self._released.set()

    def wait_released(self, timeout: float) -> None:
        self._released.wait(timeout)

    def take_stall(self, path: str) -> int | None:
        with self._lock:
            return self._stalls.pop(path, None)

    def record(self, method: str, path: str, range_header: str, sent: str = "", n: int = 0) -> None:
        with self._lock:
            self.log.requests.append((method, path, range_header))
            if sent:
                self.log.bytes_sent[sent] = self.log.bytes_sent.get(sent, 0) + n

    def __enter__(self) -> StandInHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


_REVISION = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: StandInHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: tests read StandInHub.log instead

    def _error(self, status: int, code: str | None, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _repo(self, repo_id: str, revision: str) -> HubRepo | None:
        repo = self.owner.repos.get(repo_id)
        if repo is None:
            # The Hub answers 401 for an unknown repo without a token, 404 with one.
            self._error(404, "RepoNotFound", f"Repository not found: {repo_id}")
            return None
        if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted")
            return None
        if revision not in repo.revisions and revision != repo.commit:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.owner.record(self.command, path, self.headers.get("Range", ""))
        if match := _REVISION.match(path):
            repo = self._repo(match["repo"], match["rev"])
            if repo is not None:
                siblings = [{"rfilename": name} for name in repo.files]
                self._json({"id": match["repo"], "sha": repo.commit, "siblings": siblings})
            return
        if match := _TREE.match(path):
            repo = self._repo(match["repo"], match["rev"])
            if repo is not None:
                self._json([repo.entry(name) for name in sorted(repo.files)])
            return
        if match := _RESOLVE.match(path):
            repo = self._repo(match["repo"], match["rev"])
            if repo is not None:
                self._file(repo, match["path"], body)
            return
        self._error(404, None, f"no route for {path}")

    def _file(self, repo: HubRepo, name: str, body: bool) -> None:
        data = repo.files.get(name)
        if data is None:
            self._error(404, "EntryNotFound", f"{name} does not exist at {repo.commit}")
            return
        start, status = 0, 200
        wanted = _RANGE.match(self.headers.get("Range", ""))
        if wanted is not None:
            start, status = int(wanted[1]), 206
        chunk = data[start:]
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        etag = f'"{repo.etag(name)}"'
        self.send_header("ETag", etag)
        if len(data) >= LFS_THRESHOLD:
            self.send_header("X-Linked-Etag", etag)
            self.send_header("X-Linked-Size", str(len(data)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        if not body:
            return
        stall = self.owner.take_stall(name)
        try:
            if stall is not None and stall < len(chunk):
                self.wfile.write(chunk[:stall])
                self.wfile.flush()
                self.owner.record("SENT", name, "", sent=name, n=stall)
                self.owner.wait_released(120)
                chunk = chunk[stall:]
            self.wfile.write(chunk)
            self.owner.record("SENT", name, "", sent=name, n=len(chunk))
        except OSError:  # the downloader died mid-file (what the stall is for)
            self.close_connection = True
