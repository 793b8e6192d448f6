"""Typed `DSV4Deployment.spec`: the API contract (docs/crd-reference.md is generated from it)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from dsv4_operator.api.base import DURATION_SHAPE, ApiModel, DurationBounds
from dsv4_operator.api.kube_types import (
    ENV_NAME_PATTERN,
    LabelKey,
    LabelValue,
    ResourceName,
    Toleration,
)
from dsv4_operator.api.pod import PodSettings

# The engine's HTTP port inside every engine pod (sglang `--port`); fixed so probes and the
# router can be rendered without reading the pod.
ENGINE_PORT = 30000
# sgl-model-gateway `--prometheus-port` default (sglang_router router_args.py).
ROUTER_METRICS_PORT = 29000

# Durations, each with the range that keeps one object's cost to the operator bounded.
# The canary's hard floor; the operator's configuration sets a higher one (10s by default,
# trust.TrustPolicy.min_canary_interval) that tests lower to keep their runs short.
CanaryInterval = Annotated[str, DURATION_SHAPE, DurationBounds("1s", "24h")]
OomWindow = Annotated[str, DURATION_SHAPE, DurationBounds("1m", "24h")]
BakeTime = Annotated[str, DURATION_SHAPE, DurationBounds("0s", "168h")]
ScrapeInterval = Annotated[str, DURATION_SHAPE, DurationBounds("5s", "1h")]

# Upper bounds of the numbers (docs/security.md#bounds): far above any real deployment, low
# enough that one object cannot make the operator render, probe or plan without end.
MAX_ROLE_REPLICAS = 128
MAX_ROUTER_REPLICAS = 32
MAX_GPUS_PER_NODE = 64
MAX_CONTEXT_TOKENS = 1 << 24
MAX_CANARY_SESSIONS = 64
MAX_CANARY_ROUNDS = 16
MAX_LIST_ITEMS = 128
MAX_ARG_LENGTH = 4096
MAX_VALUE_LENGTH = 32768

# A Kubernetes resource quantity without a sign (apimachinery's quantity grammar).
# The exponent is an integer: apimachinery's parser (`splitREString`) refuses `1e1.5`, which
# its documented grammar would allow.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
)
Quantity = Annotated[
    Annotated[int, Field(ge=0, le=1 << 53)]
    | Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)],
    Field(json_schema_extra={"x-kubernetes-int-or-string": True}),
]


# A Hub repo id, as huggingface_hub's validate_repo_id accepts it (`org/name`).
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,95}/[A-Za-z0-9][-A-Za-z0-9_.]{0,95}$")

IndexKDtype = Literal["fp8", "bf16", "fp4"]
# DSV4 accepts only fp8_e4m3 and bfloat16; V3.2 also fp8_e5m2 (docs/engine-notes.md#kv-cache-dtype).
KvCacheDtype = Literal["fp8_e4m3", "fp8_e5m2", "bfloat16"]
Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")


class Capability(StrEnum):
    """What a patched engine image declares it has (image label `dsv4.io/capabilities`)."""

    BF16_INDEX_K = "bf16IndexK"
    """Honours SGLANG_DSV4_BF16_INDEX_K=1 (bf16 index-K pool, 256 B/token/C4 layer)."""
    INDEX_K_HICACHE_GATE = "indexKHiCacheGate"
    """Every index-K getter waits for the HiCache layer transfer (sglang PR #22811 class)."""
    POOL_SIZING_FIX = "poolSizingFix"
    """The pool configurator sizes index-K with the real dtype (docs/engine-notes.md)."""
    MULTI_STREAM_INDEX_K_FIX = "multiStreamIndexKFix"
    """The alt-stream indexer does not alias bf16 transients in the CUDA-graph pool."""


class EnvVar(ApiModel):
    """A literal environment variable passed to the engine container."""

    name: str = Field(
        min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name."
    )
    value: str = Field(default="", max_length=MAX_VALUE_LENGTH, description="Literal value.")


class PvcSource(ApiModel):
    """Model weights on a PersistentVolumeClaim."""

    claim_name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Name of the PVC in the same namespace.",
    )
    read_only: bool = Field(default=True, description="Mount the claim read-only.")


class HostPathSource(ApiModel):
    """Model weights on a directory of the node."""

    path: str = Field(pattern=r"^/", max_length=4096, description="Absolute directory on the node.")


AccessMode = Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]


class SecretKeyRef(ApiModel):
    """A key of a Secret in the deployment's namespace."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Secret name.",
    )
    key: str = Field(
        default="token",
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key in the Secret.",
    )


class HuggingFaceSource(ApiModel):
    """Weights downloaded from the Hugging Face Hub into a PVC the operator creates.

    spec.model.name is the repo id. A Job downloads the snapshot once (resumable; the Hub's
    file list gives the size up front) and verifies it; the engines start when it succeeded
    (condition WeightsReady). The claim is shared by both roles and kept with the deployment.
    """

    revision: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*$",
        description="Branch, tag or commit sha (sglang --revision).",
    )
    token_secret: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding a Hub token (gated or private repos); HF_TOKEN of the "
        "download Job only, never of the engines.",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://\S+$",
        description="Hub endpoint (HF_ENDPOINT), for a mirror; defaults to huggingface.co.",
    )
    storage: Quantity | None = Field(
        default=None,
        description="Size of the claim; defaults to 1.2 x the profile's weight size "
        "(spec.model.weightsGiB when set).",
    )
    storage_class_name: str | None = Field(
        default=None, max_length=253, description="StorageClass of the claim."
    )
    access_modes: list[AccessMode] = Field(
        default_factory=lambda: list[AccessMode](["ReadWriteMany"]),
        min_length=1,
        max_length=3,
        description="Access modes of the claim; ReadWriteMany lets prefill and decode pods "
        "on different nodes share it.",
    )
    verify: Literal["Checksum", "Size"] = Field(
        default="Checksum",
        description="Checksum: every LFS file's sha256 against the Hub's; Size: sizes only.",
    )

    @model_validator(mode="after")
    def _storage_not_zero(self) -> HuggingFaceSource:
        if self.storage is not None and not _positive_quantity(self.storage):
            raise ValueError(
                f"spec.model.cache.huggingFace.storage {self.storage!r} must be more than 0 "
                "(the claim's size; leave it out for 1.2 x the weights)"
            )
        return self


def _positive_quantity(value: int | str) -> bool:
    """A quantity (QUANTITY_PATTERN) above zero: a digit 1-9 before any suffix or exponent."""
    if isinstance(value, int):
        return value > 0
    mantissa = re.match(r"^[0-9.]*", value)
    return mantissa is not None and re.search(r"[1-9]", mantissa.group()) is not None


class ModelCache(ApiModel):
    """Where the weights live; mounted at /models in every engine pod (HF_HOME)."""

    model_config = ApiModel.with_cel(
        {
            "rule": "[has(self.pvc), has(self.hostPath), has(self.huggingFace)]"
            ".filter(x, x).size() == 1",
            "message": "set exactly one of spec.model.cache.pvc, spec.model.cache.hostPath or "
            "spec.model.cache.huggingFace",
        }
    )

    pvc: PvcSource | None = Field(default=None, description="Weights on a PVC.")
    host_path: HostPathSource | None = Field(default=None, description="Weights on a node path.")
    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Weights downloaded from the Hugging Face Hub."
    )


class ModelSpec(ApiModel):
    """The model to serve."""

    name: str = Field(
        min_length=1, max_length=1024, description="Model path or hub id (sglang --model-path)."
    )
    served_name: str | None = Field(
        default=None,
        max_length=256,
        description="Name clients use (sglang --served-model-name); defaults to the profile name.",
    )
    profile: str = Field(
        default="deepseek-v4-flash",
        max_length=64,
        description="Built-in architecture profile the planner and rules use "
        "(`dsv4 rules` and the README list them): deepseek-v4-flash or deepseek-v3.2.",
    )
    checkpoint: str | None = Field(
        default=None,
        max_length=64,
        description="Checkpoint format of the weights, one of the profile's formats "
        "(deepseek-v4-flash: fp4-experts, nvfp4, fp8; deepseek-v3.2: fp8); "
        "defaults to the profile's default format.",
    )
    weights_gib: float | None = Field(
        default=None,
        alias="weightsGiB",
        gt=0,
        le=1 << 16,
        description="Override of the profile's weight size in GiB (all ranks together).",
    )
    cache: ModelCache = Field(description="Where the weights live.")

    @model_validator(mode="after")
    def _hub_repo_id(self) -> ModelSpec:
        if self.cache.hugging_face is not None and not HUB_REPO_ID.match(self.name):
            raise ValueError(
                f"spec.model.name {self.name!r} must be a Hugging Face repo id "
                "(`organization/model`) when spec.model.cache.huggingFace is set"
            )
        return self


class HiCacheSpec(ApiModel):
    """Hierarchical (host memory) KV cache, sglang --enable-hierarchical-cache."""

    enabled: bool = Field(default=False, description="Enable HiCache.")
    ratio: float = Field(
        default=2.0,
        gt=1.0,
        le=100.0,
        description="Host pool size as a ratio of the device pool (--hicache-ratio).",
    )
    size_gb: int = Field(
        default=0,
        alias="sizeGB",
        ge=0,
        le=1 << 16,
        description="Host pool size in GB; overrides ratio when > 0 (--hicache-size).",
    )
    write_policy: Literal["write_back", "write_through", "write_through_selective"] = Field(
        default="write_through", description="--hicache-write-policy."
    )


class OverlapSpec(ApiModel):
    """Overlap switches that interact with correctness."""

    scheduler: bool = Field(
        default=False,
        description="CPU scheduler / GPU overlap; false renders --disable-overlap-schedule "
        "(PD decode deadlocks: sglang #27938, #28039, #32209).",
    )
    multi_stream: bool = Field(
        default=False,
        description="DSV4 alt-stream overlap, rendered as SGLANG_OPT_USE_MULTI_STREAM_OVERLAP "
        "(upstream default on; unsafe with bf16 index-K, DSV4-R002).",
    )


class EngineSpec(ApiModel):
    """ONE engine configuration shared by prefill and decode."""

    image: str = Field(
        min_length=1,
        max_length=512,
        description="Engine image (patched SGLang), pinned by tag or digest.",
    )
    sglang_version: str = Field(
        alias="sglangVersion",
        max_length=32,
        pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$",
        description="The SGLang release the image is built on (its `dsv4.io/sglang-version` "
        "label); selects flag names, env names and pool arithmetic. `dsv4 rules` lists the "
        "supported releases.",
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        description="What the image declares it has (its `dsv4.io/capabilities` label): "
        "bf16IndexK, indexKHiCacheGate, poolSizingFix, multiStreamIndexKFix.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    index_k_dtype: IndexKDtype = Field(
        default="fp8",
        alias="indexKDtype",
        description="Lightning-indexer key dtype: fp8 (132 B/token/C4 layer), "
        "bf16 (256, patched images), fp4 (68, Blackwell).",
    )
    kv_cache_dtype: KvCacheDtype = Field(default="fp8_e4m3", description="--kv-cache-dtype.")
    hicache: HiCacheSpec = Field(default_factory=HiCacheSpec, description="Hierarchical KV cache.")
    overlap: OverlapSpec = Field(default_factory=OverlapSpec, description="Overlap switches.")
    cuda_graph_max_bs: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="--cuda-graph-max-bs; larger decode batches run eager.",
    )
    max_running_requests: int = Field(
        default=64, ge=1, le=1 << 16, description="--max-running-requests."
    )
    mem_fraction_static: float = Field(
        default=0.85, gt=0.0, lt=1.0, description="--mem-fraction-static (weights + KV pool share)."
    )
    context_length: int = Field(
        default=131072, ge=1024, le=MAX_CONTEXT_TOKENS, description="--context-length."
    )
    tool_call_parser: str = Field(
        default="deepseekv4", max_length=64, description="--tool-call-parser."
    )
    reasoning_parser: str = Field(
        default="deepseek-v4", max_length=64, description="--reasoning-parser."
    )
    extra_args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Passthrough sglang arguments for both roles; "
        "flags the operator owns are refused.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Passthrough environment for both roles; names the operator owns are refused.",
    )


class GpuSpec(ApiModel):
    """The GPU product the engine pods run on."""

    product: LabelValue = Field(
        default="NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        description="Node label nvidia.com/gpu.product; also selects the built-in GPU profile.",
    )
    memory_gib: float | None = Field(
        default=None,
        alias="memoryGiB",
        gt=0,
        le=4096,
        description="Override of the profile's GPU memory.",
    )
    per_node: int = Field(
        default=8,
        ge=1,
        le=MAX_GPUS_PER_NODE,
        description="GPUs per node; a role replica never spans nodes.",
    )


class Resources(ApiModel):
    """Extra container resources (cpu, memory); GPUs come from the parallelism."""

    requests: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=16, description="Resource requests."
    )
    limits: dict[ResourceName, Quantity] = Field(
        default_factory=dict, max_length=16, description="Resource limits."
    )


class RoleOverrides(ApiModel):
    """Role-safe settings one role may change; transfer-format settings cannot differ."""

    overlap: OverlapOverride | None = Field(
        default=None, description="Overlap scheduler for this role."
    )
    cuda_graph_max_bs: int | None = Field(
        default=None, ge=1, le=4096, description="--cuda-graph-max-bs."
    )
    max_running_requests: int | None = Field(
        default=None, ge=1, le=1 << 16, description="--max-running-requests."
    )
    mem_fraction_static: float | None = Field(
        default=None, gt=0.0, lt=1.0, description="--mem-fraction-static."
    )
    extra_args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH)]] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Appended to engine.extraArgs.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Added to engine.env (wins on name).",
    )


class OverlapOverride(ApiModel):
    """Per-role overlap scheduler switch (multi-stream overlap is engine-wide)."""

    scheduler: bool | None = Field(default=None, description="Overlap scheduler for this role.")


RoleOverrides.model_rebuild()


class RoleSpec(ApiModel):
    """One engine role (prefill or decode)."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=MAX_ROLE_REPLICAS,
        description="Engine replicas of this role (with scaling External: the planner's "
        "assumption only).",
    )
    scaling: Literal["Operator", "External"] = Field(
        default="Operator",
        description="Who owns the StatefulSet's replicas: Operator sets them from `replicas`; "
        "External leaves them to an autoscaler (HPA, KEDA) and never writes them.",
    )
    tensor_parallel: int = Field(
        default=4, ge=1, le=MAX_GPUS_PER_NODE, description="--tp-size; GPUs per replica."
    )
    overrides: RoleOverrides = Field(
        default_factory=RoleOverrides,
        description="Role-safe settings that differ from spec.engine.",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Added to the GPU product selector."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Pod tolerations."
    )
    resources: Resources = Field(
        default_factory=Resources, description="cpu/memory for the engine."
    )
    pod_template: PodSettings | None = Field(
        default=None,
        description="Pod settings of this role on top of spec.podTemplate (a field set here "
        "replaces that field there; labels and annotations merge).",
    )


class RouterSpec(ApiModel):
    """sglang router / sgl-model-gateway in PD mode."""

    replicas: int = Field(default=1, ge=0, le=MAX_ROUTER_REPLICAS, description="Router replicas.")
    policy: Literal["random", "round_robin", "power_of_two", "cache_aware"] = Field(
        default="cache_aware", description="--policy."
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Router HTTP port (OpenAI API).")
    image: str | None = Field(
        default=None, max_length=512, description="Router image; defaults to spec.engine.image."
    )
    pod_template: PodSettings | None = Field(
        default=None, description="Pod settings of the router on top of spec.podTemplate."
    )


class TransferSpec(ApiModel):
    """KV transfer between prefill and decode."""

    backend: Literal["mooncake", "nixl", "mooncake_tcp", "mori", "ascend"] = Field(
        default="mooncake", description="--disaggregation-transfer-backend."
    )
    ib_devices: str | None = Field(
        default=None,
        max_length=4096,
        description="--disaggregation-ib-device (mlx5_0, a list, or per-GPU JSON).",
    )
    bootstrap_port: int = Field(
        default=8998, ge=1, le=65535, description="--disaggregation-bootstrap-port on prefill."
    )


class WorkloadSpec(ApiModel):
    """The capacity target the planner checks the KV pool against."""

    concurrent_sessions: int = Field(
        default=60, ge=1, le=1_000_000, description="Concurrent multi-turn sessions."
    )
    context_tokens: int = Field(
        default=80000, ge=1, le=MAX_CONTEXT_TOKENS, description="Context tokens per session."
    )


class SafetyPolicy(StrEnum):
    ENFORCE = "Enforce"
    WARN = "Warn"


class SafetySpec(ApiModel):
    """How rule findings gate a rollout."""

    policy: SafetyPolicy = Field(
        default=SafetyPolicy.ENFORCE,
        description="Enforce rejects error findings unless acknowledged; Warn records them.",
    )
    acknowledge: list[Annotated[str, Field(pattern=r"^DSV4-R\d{3}$", max_length=9)]] = Field(
        default_factory=list,
        max_length=64,
        description="Rule ids whose errors are accepted (reported as warnings).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class RolloutSpec(ApiModel):
    """How a new engine configuration replaces the running one."""

    strategy: Literal["Auto", "Recreate", "BlueGreen"] = Field(
        default="Auto",
        description="Auto rolls compatible changes role by role and uses Recreate for "
        "transfer-format changes; BlueGreen brings up a new pair, then switches the router.",
    )


class CanarySpec(ApiModel):
    """Multi-turn tool-calling canary sessions against the router."""

    enabled: bool = Field(default=True, description="Run the canary.")
    sessions: int = Field(
        default=8, ge=1, le=MAX_CANARY_SESSIONS, description="Concurrent canary sessions."
    )
    rounds: int = Field(
        default=4, ge=1, le=MAX_CANARY_ROUNDS, description="Tool-calling rounds per session."
    )
    interval: CanaryInterval = Field(
        default="60s",
        description="Time between canary runs (at least the operator's floor, "
        "10s by default; at most 24h).",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        description="Base URL to probe; defaults to the router Service. Another URL must lie "
        "under the operator's allow-list (docs/security.md).",
    )


TapInterval = Annotated[str, DURATION_SHAPE, DurationBounds("1s", "5m")]
TAP_PORT = 8100
TAP_METRICS_PORT = 9100


class TapSpec(ApiModel):
    """The leak tap: a proxy in front of each router that classifies production tool calls."""

    enabled: bool = Field(
        default=True,
        description="Run the tap as a sidecar of every router pod; the router Service sends "
        "traffic through it (it forwards byte for byte and never stores content).",
    )
    interval: TapInterval = Field(
        default="5s", description="How often the guard reads the taps' counters (1s to 5m)."
    )
    alpha: float = Field(
        default=0.01,
        gt=0.0,
        le=0.2,
        description="Bound on the chance that a revision at or below the leak-rate threshold "
        "is ever rolled back on traffic, however often it is checked (anytime-valid test).",
    )
    metrics_endpoints: list[Annotated[str, Field(max_length=2048)]] = Field(
        default_factory=list,
        max_length=16,
        description="The taps' /metrics URLs; defaults to every router pod's tap. Another "
        "URL must lie under the operator's canary allow-list (docs/security.md).",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Relay processes in the tap, on one port, each with its own classifier; "
        "its /metrics sums them. One relays about 17,000 streamed chunks/s on 0.6 of a core "
        "(docs/guard.md): add one for each such share of the router's traffic.",
    )
    # None, not a default object: a CRD default of {} would empty it on the API server.
    resources: Resources | None = Field(
        default=None,
        description="The tap container's resources; unset: per worker, requests cpu 500m and "
        "memory 256Mi, limit memory 1Gi.",
    )


class LeakRateSpec(ApiModel):
    """When the tool-call leak rate counts as a failure."""

    threshold: float = Field(default=0.02, gt=0.0, lt=1.0, description="Leak rate that fails.")
    min_samples: int = Field(
        default=30, ge=1, le=100_000, description="Responses needed before a verdict."
    )
    confidence: float = Field(
        default=0.999,
        gt=0.5,
        lt=1.0,
        description="One-sided confidence of the Wilson bounds (0.999: at most ~0.2 false "
        "rollbacks per 10,000 decisions at a 0.5% leak rate; see bench/guard.py).",
    )


class OomSpec(ApiModel):
    """When OOM events count as a failure."""

    max_events: int = Field(
        default=1, ge=1, le=1000, description="OOM events in the window that fail."
    )
    window: OomWindow = Field(default="10m", description="Sliding window (1m to 24h).")


class PrometheusSpec(ApiModel):
    """Optional Prometheus source for the guard."""

    url: str | None = Field(
        default=None,
        max_length=2048,
        description="Prometheus base URL; unset uses the operator's. Another URL must lie "
        "under the operator's allow-list (docs/security.md).",
    )
    leak_rate_query: str | None = Field(
        default=None, max_length=4096, description="Instant query giving a leak rate."
    )
    oom_query: str | None = Field(
        default=None, max_length=4096, description="Instant query giving OOM events."
    )


class GuardSpec(ApiModel):
    """Detect corruption and OOM, roll back to the last known good revision."""

    enabled: bool = Field(default=True, description="Run the guard.")
    canary: CanarySpec = Field(default_factory=CanarySpec, description="Canary sessions.")
    tap: TapSpec = Field(default_factory=TapSpec, description="Leak tap on production traffic.")
    leak_rate: LeakRateSpec = Field(default_factory=LeakRateSpec, description="Leak-rate verdict.")
    oom: OomSpec = Field(default_factory=OomSpec, description="OOM verdict.")
    prometheus: PrometheusSpec = Field(
        default_factory=PrometheusSpec, description="Prometheus source."
    )
    no_data: Literal["Hold", "Fail"] = Field(
        default="Hold",
        description="Hold never rolls back on missing data; Fail treats it as failure.",
    )
    error_limit: int = Field(
        default=4, ge=1, le=100, description="Consecutive source errors before GuardBlind."
    )
    bake_time: BakeTime = Field(
        default="10m",
        description="Passing time before a revision becomes last known good (0s to 168h).",
    )


class ServiceMonitorSpec(ApiModel):
    """A prometheus-operator ServiceMonitor for the engines and the router."""

    enabled: bool = Field(default=False, description="Render a ServiceMonitor.")
    interval: ScrapeInterval = Field(default="30s", description="Scrape interval (5s to 1h).")
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Extra labels (for selectors)."
    )


class MonitoringSpec(ApiModel):
    """Scraping of sglang:* and router metrics."""

    service_monitor: ServiceMonitorSpec = Field(
        default_factory=ServiceMonitorSpec, description="ServiceMonitor."
    )


_TP_FITS_NODE: list[JsonDict] = [
    {
        "rule": f"self.{role}.tensorParallel <= self.gpu.perNode",
        "message": f"spec.{role}.tensorParallel must not exceed spec.gpu.perNode: a replica "
        "cannot span nodes (DSV4-R007)",
        "fieldPath": f".{role}.tensorParallel",
    }
    for role in ROLES
]
_SPEC_RULES: list[JsonDict] = [
    *_TP_FITS_NODE,
    {
        "rule": "self.workload.contextTokens <= self.engine.contextLength",
        "message": "spec.workload.contextTokens must not exceed spec.engine.contextLength",
        "fieldPath": ".workload.contextTokens",
    },
    {
        "rule": f"self.transfer.bootstrapPort != {ENGINE_PORT}",
        "message": "spec.transfer.bootstrapPort must differ from the engine HTTP port "
        f"{ENGINE_PORT}",
        "fieldPath": ".transfer.bootstrapPort",
    },
]


class DSV4DeploymentSpec(ApiModel):
    """Desired state of a PD-disaggregated DeepSeek-V4-class deployment on SGLang."""

    model_config = ApiModel.with_cel(*_SPEC_RULES)

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(description="One engine configuration shared by both roles.")
    gpu: GpuSpec = Field(default_factory=GpuSpec, description="GPU product.")
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="Prefill role.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="Decode role.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="Router.")
    transfer: TransferSpec = Field(default_factory=TransferSpec, description="KV transfer.")
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec, description="Capacity target.")
    safety: SafetySpec = Field(default_factory=SafetySpec, description="Rule gating.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rollout strategy.")
    guard: GuardSpec = Field(default_factory=GuardSpec, description="Leak/OOM guard and rollback.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Scraping.")
    pod_template: PodSettings = Field(
        default_factory=PodSettings,
        description="Pod settings for every pod (pull secrets, service account, placement, "
        "security context, extra volumes and env); overridable per role.",
    )

    def role(self, role: Role) -> RoleSpec:
        return self.prefill if role == "prefill" else self.decode

    def pod_settings(self, component: Role | Literal["router"]) -> PodSettings:
        """spec.podTemplate with the component's own on top."""
        own = (
            self.router.pod_template if component == "router" else self.role(component).pod_template
        )
        return self.pod_template.merged(own)

    @model_validator(mode="after")
    def _pod_settings_consistent(self) -> DSV4DeploymentSpec:
        for component in ("prefill", "decode", "router"):
            self.pod_settings(component).check_mounts(component)
        for role in ROLES:
            engine_env = {e.name for e in (*self.engine.env, *self.role(role).overrides.env)}
            if clash := sorted(engine_env & {e.name for e in self.pod_settings(role).env}):
                raise ValueError(
                    f"{role} podTemplate.env: {', '.join(clash)} also in spec.engine.env or "
                    f"spec.{role}.overrides.env: set each variable in one place"
                )
        return self
