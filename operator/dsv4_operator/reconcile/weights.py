"""Where the Hub download of a revision's weights stands, read from its Job (pure).

The Job's conditions say whether it ended (Complete, Failed); the fetcher's annotation
(weights/progress.py) says how far it got and why it failed; the Job's pods say why it
does not run at all (unschedulable, image pull, an unbound claim).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_operator.kube.objects import Obj, annotations_of, name_of
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import WeightsReason
from dsv4_operator.reconcile.pod_causes import first_problem
from dsv4_operator.reconcile.world import World
from dsv4_operator.render.context import RenderContext
from dsv4_operator.render.weights import hub_source, job_name
from dsv4_operator.weights.progress import PROGRESS_ANNOTATION, WeightsProgress

# Completed download Jobs of earlier revisions kept (rollback targets), newest first.
KEPT_JOBS = 2


@dataclass(frozen=True)
class WeightsState:
    """The WeightsReady condition's content for one pass."""

    ready: bool
    reason: str
    message: str


def _job_condition(job: Obj, type_: str) -> Obj | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return dict(cond)
    return None


def _job_pods(world: World, job: str) -> list[PodView]:
    return [pod for pod in world.weights_pods if pod.labels.get("job-name") == job]


def weights_state(world: World, ctx: RenderContext) -> WeightsState | None:
    """None when the weights are not downloaded by the operator (a PVC or hostPath)."""
    hub = hub_source(ctx)
    name = job_name(ctx)
    if hub is None or name is None:
        return None
    where = f"{ctx.spec.model.name}@{hub.revision}"
    job = world.live("Job", name)
    if job is None:
        return WeightsState(
            False, WeightsReason.PENDING, f"creating Job {name} to download {where}"
        )
    report = WeightsProgress.from_annotation(annotations_of(job).get(PROGRESS_ANNOTATION))
    if _job_condition(job, "Complete") is not None:
        detail = (
            f"{report.summary()} at commit {(report.commit or '')[:12]}, {report.message}"
            if report is not None and report.phase == "Complete"
            else "downloaded"
        )
        return WeightsState(True, WeightsReason.DOWNLOADED, f"{where}: {detail} (Job {name})")
    failed = _job_condition(job, "Failed")
    if failed is not None:
        said = report is not None and report.phase == "Failed"
        reason = (
            report.reason if said and report and report.reason else None
        ) or WeightsReason.DOWNLOAD_FAILED
        cause = (report.message if said and report else None) or str(failed.get("message", ""))
        return WeightsState(
            False,
            reason,
            f"downloading {where} failed: {cause}; Job {name} gave up (delete it to retry "
            "once fixed; the downloaded part is kept)",
        )
    problem = first_problem(_job_pods(world, name), world.pod_events)
    attempts = int((job.get("status") or {}).get("failed", 0))
    verb = _VERBS.get(report.phase, "downloading") if report is not None else "downloading"
    parts = [f"{verb} {where}" + (f": {report.summary()}" if report and report.bytes_total else "")]
    if report is not None and report.phase == "Failed":
        parts.append(f"retrying after {report.reason}: {report.message}")
    elif attempts:
        parts.append(f"{attempts} attempt(s) failed, retrying")
    if problem:
        parts.append(problem)
    return WeightsState(False, WeightsReason.DOWNLOADING, "; ".join(parts) + f" (Job {name})")


_VERBS = {
    "Planning": "listing the files of",
    "Downloading": "downloading",
    "Verifying": "verifying",
}


def stale_jobs(world: World, ctx: RenderContext, ready: bool) -> list[str]:
    """Download Jobs of earlier sources to delete: any still running (their download is no
    longer wanted) and, once this source's is `ready`, the complete ones beyond the KEPT_JOBS
    newest. A rollback to a recent revision finds its Job complete and starts at once; the
    blobs stay on the claim either way (a pruned Job is created again and verifies them)."""
    keep = job_name(ctx)
    others = [j for j in world.weights_objects("Job") if name_of(j) != keep]
    running = [j for j in others if not _ended(j)]
    ended = sorted(
        (j for j in others if _ended(j)),
        key=lambda j: (str(j["metadata"].get("creationTimestamp", "")), name_of(j)),
        reverse=True,
    )
    return [name_of(j) for j in running + (ended[KEPT_JOBS:] if ready else [])]


def _ended(job: Obj) -> bool:
    return any(_job_condition(job, t) is not None for t in ("Complete", "Failed"))
