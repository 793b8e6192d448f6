"""The catalogue of reasons the operator writes: guard verdicts, rollbacks, Events, conditions.

Like cert-manager's constants.go: every reason string a user can read (in `status`, an Event
or a metric label) is a member here, and each member says in `description` when it is set and
what to do about it (the docs are generated from `CATALOGUE`). The values are wire strings:
renaming one is an API change.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self


class Reason(StrEnum):
    """A reason: its value is the string on the wire, `description` says when and what to do."""

    description: str

    def __new__(cls, value: str, description: str = "") -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member


class GuardResult(Reason):
    """The guard's result for the served revision's window: `status.guard.lastVerdict` and the
    `outcome` label of `dsv4_guard_outcome`."""

    PASS = "Pass", "The evidence says the leak rate is below the threshold; counts toward baking."
    FAIL = "Fail", "The revision leaks or runs out of memory: it is rolled back (RollbackReason)."
    NO_DATA = (
        "NoData",
        "Not enough evidence yet; nothing happens under `noData: Hold`, keep the canary running.",
    )
    ERROR = (
        "Error",
        "A source failed (canary, Prometheus); `status.guard.lastMessage` names it. After "
        "`errorLimit` in a row the guard is blind (GuardBlind): fix the source.",
    )


class GuardReason(Reason):
    """Why the guard's result is what it is: `status.guard.lastReason`."""

    OOM_BEFORE_BAKE = (
        "OOMBeforeBake",
        "Fail: an OOM event on a revision that has not baked yet. Size the engines down (the "
        "plan in status) or fix the config the spec asks for.",
    )
    OOM_EVENTS = (
        "OOMEvents",
        "Fail: `spec.guard.oom.maxEvents` OOM events within `oom.window` on a baked revision. "
        "See the runbook's DSV4OOMEvents.",
    )
    SOURCE_ERROR = (
        "SourceError",
        "Error: the last canary run or Prometheus query failed; `lastMessage` says how. Check "
        "the endpoint, the router and the URL.",
    )
    PROMETHEUS_LEAK_RATE = (
        "PrometheusLeakRate",
        "Fail when `spec.guard.prometheus.leakRateQuery` returns more than the threshold, Pass "
        "when it returns at most the threshold and the canary has too few samples.",
    )
    TRAFFIC_LEAK_RATE = (
        "TrafficLeakRate",
        "Fail: production traffic through the leak taps leaks above the threshold (anytime-valid "
        "test). See the runbook's DSV4LeakRateHigh.",
    )
    ENGINE_TOOL_CALL_DROPS = (
        "EngineToolCallDrops",
        "Fail: the revision's decode engines report (`sglang:dsv4_tool_call_drops_total` over "
        "`sglang:dsv4_tool_call_responses_total`) that their tool-call parser dropped calls in "
        "more tool-calling responses than the threshold (anytime-valid test): the client got "
        "prose instead of the call. See the runbook's DSV4LeakRateHigh.",
    )
    KV_INTEGRITY = (
        "KVIntegrity",
        "Fail: before it baked, the revision's engines failed more prefill-to-decode KV "
        "transfers (`sglang:num_transfer_failed_reqs_total`, checksum mismatches included) "
        "than `kvIntegrity.threshold` of the requests they finished. See the runbook's "
        "DSV4KVTransferFailures.",
    )
    TOO_FEW_SAMPLES = (
        "TooFewSamples",
        "NoData: fewer canary responses than `leakRate.minSamples` in the window; wait for "
        "more canary runs.",
    )
    LEAK_RATE = (
        "LeakRate",
        "Fail when the canary's leak rate is above the threshold with confidence, Pass when it "
        "is below it with confidence.",
    )
    INCONCLUSIVE = (
        "Inconclusive",
        "NoData: enough canary responses, but the confidence bounds straddle the threshold; the "
        "window keeps collecting.",
    )
    NO_DATA = (
        "NoData",
        "Fail under `noData: Fail`: the settled revision still had no conclusive canary evidence "
        "after bakeTime. Make the canary reach the router, or use `noData: Hold`.",
    )


class RollbackReason(Reason):
    """Why a failing verdict rolls back: `status.quarantine[].reason`, the reason of the
    `RolledBack` condition and the `reason` label of `dsv4_rollbacks_total`."""

    LEAK_RATE = (
        "LeakRate",
        "The revision leaked tool-call markup above the threshold (canary, taps or Prometheus). "
        "Change the engine config; the runbook's DSV4LeakRateHigh lists the known causes.",
    )
    OOM = (
        "OOM",
        "The revision ran out of memory. Change the engine config or the workload; see the "
        "runbook's DSV4OOMEvents.",
    )
    NO_DATA = (
        "NoData",
        "`noData: Fail` and no conclusive evidence within bakeTime. Make the canary work, or "
        "use `noData: Hold`.",
    )
    KV_INTEGRITY = (
        "KVIntegrity",
        "Prefill-to-decode KV transfers of the revision failed (or failed their checksum) above "
        "`kvIntegrity.threshold` before it baked; the failed requests were answered HTTP 500. "
        "See the runbook's DSV4KVTransferFailures.",
    )


class WeightsReason(Reason):
    """The reason of the `WeightsReady` condition (Hub downloads); the fetcher's failures
    (weights.progress.FailureReason) are named by the same members."""

    PENDING = (
        "Pending",
        "Nothing downloads yet: the Job is being created, its claim is not bound or its pod "
        "cannot be scheduled or started (the message says which). A claim that stays unbound "
        "needs a StorageClass that can provision `spec.model.cache.huggingFace.storage` (a "
        "DSV4Model's `spec.storage`).",
    )
    DOWNLOADING = (
        "Downloading",
        "The Job lists or downloads the files; the message gives the bytes and files done of "
        "the total (a failed attempt is retried and resumes); the rollout waits, the running "
        "pair keeps serving.",
    )
    VERIFYING = (
        "Verifying",
        "Every file is downloaded; the Job checks their sizes and sha256 (files done of the "
        "total in the message).",
    )
    TOKEN_SECRET_MISSING = (
        "TokenSecretMissing",
        "`spec.model.cache.huggingFace.tokenSecret` (a DSV4Model's `spec.tokenSecret`) names a "
        "Secret that does not exist in the "
        "namespace: no download Job is created until it does. Create it (key `token`), or "
        "remove the field for a public repo.",
    )
    DOWNLOADED = "Downloaded", "The weights of this source are on the claim and verified."
    DOWNLOAD_FAILED = (
        "DownloadFailed",
        "The Job gave up without a reason of its own; its message says why. Delete the Job to "
        "retry once fixed (the downloaded part is kept).",
    )
    UNAUTHORIZED = (
        "Unauthorized",
        "The Hub refused access (gated or private repo): set "
        "`spec.model.cache.huggingFace.tokenSecret` (a DSV4Model's `spec.tokenSecret`) to a "
        "Secret with a token that may read it.",
    )
    NOT_FOUND = (
        "NotFound",
        "The repository, revision or a file is not on the Hub: fix `spec.model.name` or "
        "`spec.model.cache.huggingFace.revision` (a DSV4Model's `spec.repo`, `spec.revision`).",
    )
    DISK_FULL = (
        "DiskFull",
        "The weights volume is too small: raise `spec.model.cache.huggingFace.storage` (a "
        "DSV4Model's `spec.storage`), or free the volume.",
    )
    VERIFY_FAILED = (
        "VerifyFailed",
        "A downloaded file has the wrong size or sha256 (the message names it). Delete the Job "
        "to download again.",
    )
    MODEL_MISSING = (
        "ModelMissing",
        "`spec.model.cache.model` names a DSV4Model that does not exist in the namespace: "
        "create it (docs/models.md) or name another one; the engines wait.",
    )
    MODEL_MISMATCH = (
        "ModelMismatch",
        "The referenced DSV4Model holds another repo than `spec.model.name`: set "
        "spec.model.name to the model's `spec.repo`, or reference a model of that repo.",
    )
    HUB_UNAVAILABLE = (
        "HubUnavailable",
        "The Hub could not be reached (connection, timeout, 5xx) until the Job ran out of "
        "retries. Check egress (proxy, DNS), then delete the Job to retry.",
    )


def weights_event_reason(reason: str) -> str:
    """The Event reason for a WeightsReady reason (`Downloading` -> `WeightsDownloading`)."""
    return f"Weights{reason}"


def _weights_event(reason: WeightsReason) -> tuple[str, str]:
    return weights_event_reason(reason), reason.description


class EventReason(Reason):
    """The reason of a Kubernetes Event the operator posts on a DSV4Deployment."""

    # The guard
    ROLLED_BACK = (
        "RolledBack",
        "Warning: the guard rolled back to the last known good revision and quarantined the "
        "failing one. Read the evidence in the message; fix the spec.",
    )
    BAKED = (
        "Baked",
        "The revision passed bakeTime and is now `status.lastKnownGoodRevision`. Nothing to do.",
    )
    QUARANTINE_CLEARED = (
        "QuarantineCleared",
        "The `dsv4.io/clear-quarantine` annotation released a revision; it starts a fresh window.",
    )
    GUARD_BLIND = (
        "GuardBlind",
        "Warning: the guard's sources failed `errorLimit` times in a row; it cannot judge the "
        "revision. Fix the canary endpoint or Prometheus.",
    )
    NO_KNOWN_GOOD = (
        "NoKnownGood",
        "Warning: a revision failed (or is quarantined) and no revision has baked to roll back "
        "to; the current one keeps running. Fix the spec yourself.",
    )
    PLAN_MISMATCH = (
        "PlanMismatch",
        "Warning: an engine pod reports (`/server_info`) a KV pool, a resolved argument or "
        "a release other than the plan and the render; the revision is not baked while it "
        "stands. The message names the pod and both values.",
    )
    # The culprit search (docs/bisect.md)
    BISECT_STARTED = (
        "BisectStarted",
        "After a rollback, `spec.guard.bisect` started searching the configuration delta for "
        "the settings to blame, on shadow pairs beside the serving one. Nothing to do.",
    )
    CULPRIT_FOUND = (
        "CulpritFound",
        "Warning: the culprit search found the smallest set of settings that leaks on this GPU "
        "product and release (`status.guard.culprit`). Leave it out of the spec.",
    )
    CULPRIT_NOT_FOUND = (
        "CulpritNotFound",
        "The culprit search ended blaming nothing; the message says why (the leak did not "
        "reproduce, inconclusive probes, the budget or the time limit, or the spec changed).",
    )
    # The rollout
    CREATING = "Creating", "The first pair of a revision is being created."
    ROLLING_UPDATE = (
        "RollingUpdate",
        "A change with the same P/D transfer format rolls in place, decode first.",
    )
    CHILD_RECREATED = (
        "ChildRecreated",
        "Warning: a role's StatefulSet was missing (deleted by someone) and was recreated. Find "
        "who deletes it.",
    )
    RECREATE = (
        "Recreate",
        "The transfer format changes under `rollout.strategy: Recreate`: the router and the old "
        "pair stop before the new pair starts (downtime).",
    )
    BLUE_GREEN_STARTED = (
        "BlueGreenStarted",
        "The transfer format changes under BlueGreen: a new pair starts next to the old one.",
    )
    ROUTER_SWITCHED = "RouterSwitched", "BlueGreen: the router now targets the new pair."
    OLD_PAIR_DELETED = "OldPairDeleted", "The pair(s) no longer served were deleted."
    ORPHANS_DELETED = (
        "OrphansDeleted",
        "Services or PDBs of pairs without a StatefulSet were deleted (a cut-short cleanup).",
    )
    REVISION_CREATED = (
        "RevisionCreated",
        "An engine config was stored as a ControllerRevision (a rollback target).",
    )
    INVALID = (
        "Invalid",
        "Warning: the spec is refused by a rule or the schema; nothing is rolled out and "
        "running children keep their config. Fix the fields the message names.",
    )
    CHILD_REJECTED = (
        "ChildRejected",
        "Warning: the API server refused a child the operator wrote (its validation or a "
        "namespace policy); the message names the child and the field.",
    )
    CRD_MISSING = (
        "CRDMissing",
        "Warning: a ServiceMonitor is asked for but its CRD is not served. Install the "
        "prometheus-operator CRDs or disable `spec.monitoring.serviceMonitor`.",
    )
    GROUP_RESTARTED = (
        "GroupRestarted",
        "Warning: a pod of a multi-node group failed, so the LeaderWorkerSet recreates the whole "
        "group; the message and `status.groupRestarts` keep the last termination of every pod "
        "of it (the restart deletes them). Read them as an engine crash of the role.",
    )
    GROUPS_UNAVAILABLE = (
        "GroupsUnavailable",
        "Warning: a role's replica spans nodes (LeaderWorkerSet groups) but the API server does "
        "not serve `leaderworkerset.x-k8s.io/v1`. Install LWS v0.9.0 or later "
        "(docs/multinode.md); nothing is rolled out until then, running children keep serving.",
    )
    # The weights download: "Weights" + the WeightsReady reason (weights_event_reason); a
    # Warning for all but Pending, Downloading and Verifying. Never posted for Downloaded.
    WEIGHTS_PENDING = _weights_event(WeightsReason.PENDING)
    WEIGHTS_DOWNLOADING = _weights_event(WeightsReason.DOWNLOADING)
    WEIGHTS_VERIFYING = _weights_event(WeightsReason.VERIFYING)
    WEIGHTS_TOKEN_SECRET_MISSING = _weights_event(WeightsReason.TOKEN_SECRET_MISSING)
    WEIGHTS_DOWNLOAD_FAILED = _weights_event(WeightsReason.DOWNLOAD_FAILED)
    WEIGHTS_UNAUTHORIZED = _weights_event(WeightsReason.UNAUTHORIZED)
    WEIGHTS_NOT_FOUND = _weights_event(WeightsReason.NOT_FOUND)
    WEIGHTS_DISK_FULL = _weights_event(WeightsReason.DISK_FULL)
    WEIGHTS_VERIFY_FAILED = _weights_event(WeightsReason.VERIFY_FAILED)
    WEIGHTS_HUB_UNAVAILABLE = _weights_event(WeightsReason.HUB_UNAVAILABLE)
    WEIGHTS_MODEL_MISSING = _weights_event(WeightsReason.MODEL_MISSING)
    WEIGHTS_MODEL_MISMATCH = _weights_event(WeightsReason.MODEL_MISMATCH)
    MODEL_IN_USE = (
        "ModelInUse",
        "A DSV4Model was deleted while DSV4Deployments reference it: it and its weights stay "
        "until they are deleted or reference another model (the message names them).",
    )


class ConditionReason(Reason):
    """The reason of a status condition (other than WeightsReady, and RolledBack=True, whose
    reason is the RollbackReason)."""

    # Validated
    VALID = "Valid", "Validated=True: no error findings (warnings are listed in `findings`)."
    RULE_VIOLATION = (
        "RuleViolation",
        "Validated=False: a DSV4 rule refuses the spec; `findings` say what breaks and what to "
        "change.",
    )
    SCHEMA_INVALID = (
        "SchemaInvalid",
        "Validated=False: the spec does not match the schema; fix the field the message names.",
    )
    # Progressing
    SPEC_INVALID = "SpecInvalid", "Progressing=False: no rollout while the spec is invalid."
    CREATING = "Creating", "Progressing=True: the first pair of a revision is being created."
    ROLLING_UPDATE = (
        "RollingUpdate",
        "Progressing=True: a role rolls in place to the new revision, decode first, then the "
        "router's pods become available (also after a Recreate).",
    )
    RECREATING = (
        "Recreating",
        "Progressing=True: the old pair (and router) stop before the new transfer format starts.",
    )
    BLUE_GREEN = "BlueGreen", "Progressing=True: a new pair starts next to the old one."
    SWITCHING_ROUTER = (
        "SwitchingRouter",
        "Progressing=True: the router rolls to the new pair before the old one is deleted.",
    )
    CLEANING_UP = "CleaningUp", "Progressing=True: pairs or objects no longer used are deleted."
    GROUPS_UNAVAILABLE = (
        "GroupsUnavailable",
        "Progressing=True, Degraded=True: a role's replica spans nodes but LeaderWorkerSet is "
        "not served. Install LWS v0.9.0 or later (docs/multinode.md), or fit each replica on "
        "one node; running children keep serving.",
    )
    WAITING_FOR_WEIGHTS = (
        "WaitingForWeights",
        "Progressing=True: the rollout waits for the weights download (see WeightsReady).",
    )
    QUARANTINED = (
        "Quarantined",
        "Progressing=True: the spec's revision is quarantined and nothing else can be served. "
        "Change the spec or clear the quarantine.",
    )
    ROLLOUT_COMPLETE = (
        "RolloutComplete",
        "Progressing=False: every role runs the desired revision.",
    )
    CHILD_REJECTED = (
        "ChildRejected",
        "Progressing=False: the API server refused a child (its validation or a namespace "
        "policy); the message names the child and the field.",
    )
    # Ready
    ALL_REPLICAS_READY = "AllReplicasReady", "Ready=True: all roles and the router are ready."
    REPLICAS_NOT_READY = (
        "ReplicasNotReady",
        "Ready=False: some replicas are not ready; the message names the first pod problem.",
    )
    WEIGHTS_NOT_READY = (
        "WeightsNotReady",
        "Ready=False: the engines wait for the weights download (see WeightsReady).",
    )
    # Degraded: True only for a fault (a planned rollout, Recreate included, is Progressing)
    AS_EXPECTED = (
        "AsExpected",
        "Degraded=False: no fault; the message says what the rollout does. Nothing to do.",
    )
    REPLICAS_UNAVAILABLE = (
        "ReplicasUnavailable",
        "Degraded=True: the rollout is complete but replicas are not ready; see the message.",
    )
    UNSCHEDULABLE = (
        "Unschedulable",
        "Degraded=True: a pod cannot be scheduled; the message quotes the scheduler (no node "
        "with the GPU product label, not enough GPUs, an unbound claim). Add nodes or fix "
        "`spec.gpu` and the placement.",
    )
    IMAGE_PULL_BACK_OFF = (
        "ImagePullBackOff",
        "Degraded=True: a pod's image cannot be pulled (also ErrImagePull, InvalidImageName); "
        "fix `spec.engine.image` or the pull secrets (`spec.podTemplate.imagePullSecrets`).",
    )
    CRASH_LOOP_BACK_OFF = (
        "CrashLoopBackOff",
        "Degraded=True: a container keeps exiting; the message gives its last exit. Read its "
        "logs (`kubectl logs --previous`).",
    )
    CREATE_CONTAINER_CONFIG_ERROR = (
        "CreateContainerConfigError",
        "Degraded=True: a container cannot be created from its config (also "
        "CreateContainerError), most often a missing Secret or ConfigMap key; the message "
        "names it. Create it.",
    )
    PROGRESS_DEADLINE_EXCEEDED = (
        "ProgressDeadlineExceeded",
        "Degraded=True, phase Failed: the rollout made no progress (its Progressing reason did "
        "not change) for `spec.progressDeadlineSeconds` (default 600); the message says where "
        "it stands. A running download with figures is progress. Fix the cause the message "
        "names; the operator keeps trying.",
    )
    WEIGHTS_FAILED = (
        "WeightsFailed",
        "Degraded=True, phase Failed: the weights cannot be had (the download Job gave up, or "
        "its token Secret is missing); WeightsReady says why and what to do.",
    )
    NO_KNOWN_GOOD = (
        "NoKnownGood",
        "Degraded=True: a revision failed or is quarantined and there is no last known good "
        "revision to roll back to. Fix the spec yourself.",
    )
    # RolledBack (True carries the RollbackReason)
    NOT_ROLLED_BACK = "NotRolledBack", "RolledBack=False: the spec's revision is served."
    # GuardBlind
    SEEING = "Seeing", "GuardBlind=False: the guard's sources answer."
    SOURCE_ERRORS = (
        "SourceErrors",
        "GuardBlind=True: a source failed `errorLimit` times in a row; fix the canary endpoint "
        "or Prometheus (the message names them).",
    )
    # PlanVerified
    VERIFIED = (
        "Verified",
        "PlanVerified=True: every engine pod of the revision reports the planned "
        "`max_total_num_tokens`, the rendered arguments and the spec's SGLang release.",
    )
    PLAN_MISMATCH = (
        "PlanMismatch",
        "PlanVerified=False: an engine pod reports other numbers than the plan (the message "
        "names the pod and both values); the revision is never baked while it stands. Check "
        "the image's release and the GPU's free memory (docs/planner.md).",
    )
    NOT_ANSWERED = (
        "NotAnswered",
        "PlanVerified=False: not every engine pod of the revision has answered "
        "`/server_info` yet (starting, or unreachable from the operator).",
    )
    # LeakShapesVisible
    ENGINE_COUNTS = (
        "EngineCounts",
        "LeakShapesVisible=True: the image counts its parser's dropped tool calls "
        "(`toolCallDropCounter`); the guard sees silent drops on `tool_choice: auto` traffic.",
    )
    NO_DROP_COUNTER = (
        "NoDropCounter",
        "LeakShapesVisible=False: the image does not declare `toolCallDropCounter`; a call its "
        "parser drops on `tool_choice: auto` traffic reaches the client as prose, which neither "
        "the tap nor Prometheus can tell from an answer: the canary, which knows a call is due, "
        "remains the signal. Use an image with the drop counter (images/engine/patches).",
    )
    # InUse (a DSV4Model's)
    REFERENCED = (
        "Referenced",
        "InUse=True: DSV4Deployments reference the DSV4Model (the message and status.usedBy "
        "name them); deleting it waits for them (finalizer dsv4.io/model-in-use).",
    )
    UNUSED = (
        "Unused",
        "InUse=False: no DSV4Deployment references the DSV4Model; deleting it deletes its "
        "claim and download Jobs.",
    )
    DELETION_WAITS = (
        "DeletionWaits",
        "InUse=True: the DSV4Model was deleted while DSV4Deployments reference it (named in "
        "the message): it and its weights stay until they are deleted or reference another "
        "model.",
    )
    # Bisected
    BISECTING = (
        "Bisecting",
        "Bisected=False: a culprit search runs on shadow pairs; the message counts its probes.",
    )
    CULPRIT_IDENTIFIED = (
        "CulpritIdentified",
        "Bisected=True: the search found the settings to blame (`status.guard.culprit`); leave "
        "them out of the spec.",
    )
    NOT_REPRODUCED = (
        "NotReproduced",
        "Bisected=False: the rejected configuration did not leak again on a shadow pair, so no "
        "setting is blamed (noise, or a load the canary does not reach).",
    )
    NO_CULPRIT = (
        "NoCulprit",
        "Bisected=False: the search ended without an answer (inconclusive probes, the budget, "
        "the time limit, or a spec change); the message says which. Raise the budget to retry.",
    )
    # MonitoringReady
    APPLIED = "Applied", "MonitoringReady=True: the ServiceMonitor is applied."
    DISABLED = "Disabled", "MonitoringReady=True: no ServiceMonitor asked for."
    CRD_MISSING = (
        "CRDMissing",
        "MonitoringReady=False: the ServiceMonitor CRD is not served. Install the "
        "prometheus-operator CRDs or disable `spec.monitoring.serviceMonitor`.",
    )


def condition_rows() -> list[tuple[str, str, str, str]]:
    """(condition, status, reason, when it is set and what to do) for every reason a status
    condition can carry: ConditionReason descriptions open with `Type=Status:` (Degraded's
    may add `, phase Failed`), WeightsReady's are the WeightsReason members, RolledBack=True's
    the RollbackReason members."""
    rows = []
    for member in ConditionReason:
        head, _, text = member.description.partition(": ")
        type_, _, status = head.partition("=")
        status, _, phase = status.partition(", ")
        rows.append((type_, status, member.value, f"{phase}: {text}" if phase else text))
    for weights in WeightsReason:
        status = "True" if weights is WeightsReason.DOWNLOADED else "False"
        rows.append(("WeightsReady", status, weights.value, weights.description))
    rows += [("RolledBack", "True", r.value, r.description) for r in RollbackReason]
    return rows


# Every catalogue, in the order the docs list them.
CATALOGUE: tuple[type[Reason], ...] = (
    GuardResult,
    GuardReason,
    RollbackReason,
    EventReason,
    ConditionReason,
    WeightsReason,
)
