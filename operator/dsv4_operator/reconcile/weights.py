"""Where the Hub download of a DSV4Model's weights stands, read from its Job (pure); and what
a deployment reads of it (the model's WeightsReady condition).

The Job's conditions say whether it ended (Complete, Failed); the fetcher's annotation
(weights/progress.py) says how far it got and why it failed; the Job's pods say why it
does not run at all (unschedulable, image pull, an unbound claim).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from dsv4_operator.api.model import HuggingFaceSource
from dsv4_operator.api.models import DSV4ModelSpec, parse_model_status
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.objects import Obj, annotations_of, name_of
from dsv4_operator.names import MODEL_KIND, weights_claim_name
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import WeightsReason
from dsv4_operator.reconcile.model_world import ModelWorld
from dsv4_operator.reconcile.pod_causes import first_problem
from dsv4_operator.reconcile.world import World
from dsv4_operator.render.weights import ModelContext, job_name
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


def _job_pods(world: ModelWorld, job: str) -> list[PodView]:
    return [pod for pod in world.weights_pods if pod.labels.get("job-name") == job]


def weights_state(world: ModelWorld, ctx: ModelContext) -> WeightsState:
    """The model's WeightsReady: the download of its source, from its Job."""
    hub = ctx.spec
    name = job_name(ctx)
    where = f"{hub.repo}@{hub.revision}"
    job = world.live("Job", name)
    complete = job is not None and _job_condition(job, "Complete") is not None
    secret = hub.token_secret
    if secret is not None and secret.name in world.missing_secrets and not complete:
        return WeightsState(
            False,
            WeightsReason.TOKEN_SECRET_MISSING,
            f"Secret {secret.name} (tokenSecret of DSV4Model {ctx.name}) does not exist in "
            f"namespace {world.namespace}: no download Job for {where} is created until it "
            f"does; create it with the key {secret.key!r} holding a Hub token, or remove "
            "tokenSecret for a public repo",
        )
    if job is None:
        return WeightsState(
            False, WeightsReason.PENDING, f"creating Job {name} to download {where}"
        )
    report = WeightsProgress.from_annotation(annotations_of(job).get(PROGRESS_ANNOTATION))
    if complete:
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
    return _running(world, ctx, name, where, job, report)


def _running(
    world: ModelWorld,
    ctx: ModelContext,
    name: str,
    where: str,
    job: Obj,
    report: WeightsProgress | None,
) -> WeightsState:
    """A Job that has not ended: Pending until it reports figures, then Downloading, then
    Verifying (never back: all bytes on disk, or Verifying said before for this Job)."""
    notes = []
    attempts = int((job.get("status") or {}).get("failed", 0))
    if report is not None and report.phase == "Failed":
        notes.append(f"retrying after {report.reason}: {report.message}")
    elif attempts:
        notes.append(f"{attempts} attempt(s) failed, retrying")
    problem = first_problem(_job_pods(world, name), world.pod_events)
    if problem:
        notes.append(problem)
    tail = "".join(f"; {note}" for note in notes) + f" (Job {name})"
    figures = report is not None and report.phase != "Failed" and report.bytes_total is not None
    if report is None or not figures:
        return WeightsState(False, WeightsReason.PENDING, _pending(world, ctx, where) + tail)
    previous = next((c for c in world.status.conditions if c.type == "WeightsReady"), None)
    verifying = (
        report.phase == "Verifying"
        or report.bytes_done >= (report.bytes_total or 0)
        or (
            previous is not None
            and previous.reason == WeightsReason.VERIFYING
            and previous.message.endswith(f"(Job {name})")
        )
    )
    if verifying:
        return WeightsState(
            False, WeightsReason.VERIFYING, f"verifying {where}: {report.summary()}{tail}"
        )
    return WeightsState(
        False, WeightsReason.DOWNLOADING, f"downloading {where}: {report.summary()}{tail}"
    )


def _pending(world: ModelWorld, ctx: ModelContext, where: str) -> str:
    """Why nothing downloads yet: the claim not bound, or the Job's pod not running."""
    claim_name = weights_claim_name(ctx.name)
    claim = world.live("PersistentVolumeClaim", claim_name)
    phase = str(((claim or {}).get("status") or {}).get("phase") or "Pending")
    said = f"nothing downloads {where} yet"
    if phase != "Bound":
        return (
            f"{said}: claim {claim_name} is {phase}, not bound (a StorageClass must provision "
            "it, or it binds once the Job's pod is scheduled)"
        )
    running = any(p.phase == "Running" for p in _job_pods(world, job_name(ctx)))
    return f"{said}: listing its files" if running else f"{said}: the Job's pod is not running"


def stale_jobs(world: ModelWorld, ctx: ModelContext, ready: bool) -> list[str]:
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


# What a download is of: a live DSV4Model whose spec differs in these is not yet the one wanted.
SOURCE_FIELDS = ("repo", "revision", "endpoint", "verify", "tokenSecret")


def deployment_weights(
    model: Obj | None, model_name: str, repo: str, wanted: Obj | None = None
) -> WeightsState:
    """A deployment's WeightsReady: its DSV4Model's, as that model reports it for the source
    the deployment wants. `wanted`: the model an inline Hub repo makes (None: the model is
    referenced by spec.model.cache.model)."""
    if model is None:
        if wanted is None:
            return WeightsState(
                False,
                WeightsReason.MODEL_MISSING,
                f"DSV4Model {model_name} (spec.model.cache.model) does not exist in this "
                "namespace: create it (docs/models.md) or name another one",
            )
        return WeightsState(
            False, WeightsReason.PENDING, f"creating DSV4Model {model_name} to download {repo}"
        )
    spec = model.get("spec") or {}
    if wanted is None and spec.get("repo") != repo:
        return WeightsState(
            False,
            WeightsReason.MODEL_MISMATCH,
            f"DSV4Model {model_name} holds {spec.get('repo')}, not spec.model.name {repo}: set "
            "spec.model.name to the model's spec.repo, or reference a model of this repo",
        )
    source = {k: spec.get(k) for k in SOURCE_FIELDS}
    status = parse_model_status(model.get("status"))
    generation = int(model["metadata"].get("generation") or 0)
    stale = wanted is not None and source != {k: wanted["spec"].get(k) for k in SOURCE_FIELDS}
    # Deleting a custom resource bumps its generation: no new spec, and a model being deleted
    # starts nothing new, so its last word on the download stands.
    behind = (status.observed_generation or 0) < generation and not model["metadata"].get(
        "deletionTimestamp"
    )
    if stale or behind:
        return WeightsState(
            False,
            WeightsReason.PENDING,
            f"DSV4Model {model_name} has not taken up {repo}@{spec.get('revision')} yet",
        )
    weights = next((c for c in status.conditions if c.type == "WeightsReady"), None)
    if weights is None:
        return WeightsState(
            False, WeightsReason.PENDING, f"DSV4Model {model_name} has not reported yet"
        )
    return WeightsState(weights.status == "True", weights.reason, weights.message)


def with_model_source(spec: DSV4DeploymentSpec, world: World) -> DSV4DeploymentSpec:
    """A spec that references a DSV4Model, with that model's source filled in as
    spec.model.cache.huggingFace (the revision the engines load, part of the config hash);
    the spec as it is otherwise, or while the model is missing or unreadable."""
    ref = spec.model.cache.model
    model = world.live(MODEL_KIND, ref.name) if ref is not None else None
    if model is None:
        return spec
    try:
        source = DSV4ModelSpec.model_validate(model.get("spec") or {})
    except ValidationError:
        return spec
    hub = HuggingFaceSource.model_validate(
        source.model_dump(include=set(HuggingFaceSource.model_fields))
    )
    cache = spec.model.cache.model_copy(update={"hugging_face": hub})
    return spec.model_copy(update={"model": spec.model.model_copy(update={"cache": cache})})
