"""The fetcher's reporter: its progress as an annotation on its own Job (or just the log)."""

from __future__ import annotations

import logging

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from dsv4_operator.weights.progress import PROGRESS_ANNOTATION, WeightsProgress

log = logging.getLogger(__name__)


class LogReporter:
    """Progress to the log only (no Job to report on, e.g. a local run)."""

    def report(self, progress: WeightsProgress) -> None:
        if progress.phase == "Planning":
            log.info("listing the files of %s@%s", progress.repo, progress.revision)
        elif progress.phase == "Failed":
            log.info("Failed %s: %s: %s", progress.repo, progress.reason, progress.message)
        else:
            log.info("%s %s: %s", progress.phase, progress.repo, progress.summary())


class JobReporter(LogReporter):
    """Patches PROGRESS_ANNOTATION on Job `namespace/name` with the pod's service account.

    A report that cannot be written is logged once and dropped: progress is a courtesy, the
    download goes on (the Job's own status still tells the operator when it ends).
    """

    def __init__(self, namespace: str, job: str) -> None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]  # local run: $KUBECONFIG
        self._batch = client.BatchV1Api()
        self._namespace = namespace
        self._job = job
        self._warned = False

    def report(self, progress: WeightsProgress) -> None:
        super().report(progress)
        body = {"metadata": {"annotations": {PROGRESS_ANNOTATION: progress.to_annotation()}}}
        try:
            self._batch.patch_namespaced_job(self._job, self._namespace, body)
        except (ApiException, OSError) as exc:
            if not self._warned:
                log.warning("cannot report progress on job %s: %s", self._job, exc)
                self._warned = True
