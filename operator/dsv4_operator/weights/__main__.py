"""`python -m dsv4_operator.weights`: the weights Job's entry point, configured by env.

DSV4_WEIGHTS_REPO, DSV4_WEIGHTS_REVISION, DSV4_WEIGHTS_VERIFY (Size|Checksum),
DSV4_WEIGHTS_NAMESPACE + DSV4_WEIGHTS_JOB (where to report; unset: log only),
HF_HUB_CACHE (or HF_HOME), HF_ENDPOINT, HF_TOKEN: as huggingface_hub reads them.
The exit code is the failure's (progress.FailureReason); the message also goes to the
container's termination log, which `kubectl describe pod` shows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

from dsv4_operator.weights.fetch import FetchError, FetchRequest, Verify, fetch
from dsv4_operator.weights.progress import WeightsProgress
from dsv4_operator.weights.report import JobReporter, LogReporter

TERMINATION_LOG = "/dev/termination-log"
log = logging.getLogger("dsv4_operator.weights")


def _request(env: dict[str, str]) -> FetchRequest:
    home = Path(env.get("HF_HOME", "~/.cache/huggingface")).expanduser()
    verify: Verify = "Size" if env.get("DSV4_WEIGHTS_VERIFY") == "Size" else "Checksum"
    return FetchRequest(
        repo=env["DSV4_WEIGHTS_REPO"],
        revision=env.get("DSV4_WEIGHTS_REVISION", "main"),
        cache_dir=Path(env.get("HF_HUB_CACHE", str(home / "hub"))),
        endpoint=env.get("HF_ENDPOINT") or None,
        token=env.get("HF_TOKEN") or None,
        verify=verify,
    )


def _terminate(message: str) -> None:
    path = Path(os.environ.get("DSV4_TERMINATION_LOG", TERMINATION_LOG))
    with contextlib.suppress(OSError):  # not in a pod
        path.write_text(message[:4096])


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    env = dict(os.environ)
    request = _request(env)
    job, namespace = env.get("DSV4_WEIGHTS_JOB"), env.get("DSV4_WEIGHTS_NAMESPACE")
    reporter = JobReporter(namespace, job) if job and namespace else LogReporter()
    log.info(
        "fetching %s@%s from %s (verify %s, %s)",
        request.repo,
        request.revision,
        request.endpoint or "https://huggingface.co",
        request.verify,
        "with a token" if request.token else "without a token",
    )
    try:
        final = fetch(request, reporter, interval=float(env.get("DSV4_WEIGHTS_INTERVAL", "5")))
    except FetchError as err:
        log.error(
            "failed (%s, exit code %d%s): %s",
            err.reason.reason,
            err.reason.exit_code,
            "" if err.reason.permanent else "; the Job retries and the next attempt resumes",
            err.message,
        )
        failed = WeightsProgress(
            phase="Failed",
            repo=request.repo,
            revision=request.revision,
            reason=err.reason.reason,
            message=err.message,
        )
        reporter.report(failed)
        _terminate(f"{err.reason.reason}: {err.message}")
        return err.reason.exit_code
    _terminate(f"Complete: {final.summary()} at {final.commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
