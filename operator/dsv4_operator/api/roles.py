"""Where and how many engines run: GPU, roles and their overrides, router, transfer, workload."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.engine import EnvVar
from dsv4_operator.api.kube_types import LabelKey, LabelValue, ResourceName, Toleration
from dsv4_operator.api.limits import (
    MAX_ARG_LENGTH,
    MAX_CONTEXT_TOKENS,
    MAX_GPUS_PER_NODE,
    MAX_GPUS_PER_REPLICA,
    MAX_LIST_ITEMS,
    MAX_ROLE_REPLICAS,
    MAX_ROUTER_REPLICAS,
    Quantity,
)
from dsv4_operator.api.pod import PodSettings

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")
# --moe-a2a-backend values both supported releases accept on CUDA (sglang server_args.py
# MOE_A2A_BACKEND_CHOICES in 0.5.16, arg_groups/fields/exec_.py in 0.5.23; the Ascend-only
# values and 0.5.23's newer ones are left to extraArgs).
# A node label key naming a topology domain; hostname is no domain a group of whole-node pods
# can share (each pod needs a node of its own).
HOSTNAME_LABEL = "kubernetes.io/hostname"


def _group_domain(key: str) -> str:
    if key == HOSTNAME_LABEL:
        raise ValueError(
            f"{HOSTNAME_LABEL} puts every pod of a group on one node, and each pod of a group "
            "needs a whole node: name a label whose value several nodes share (a rack or "
            "NVLink domain label), or leave exclusiveTopology unset"
        )
    return key


TopologyKey = Annotated[LabelKey, AfterValidator(_group_domain)]
MoeAllToAll = Literal["none", "deepep", "mooncake", "nixl", "mori", "flashinfer", "megamoe"]


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
        description="GPUs per node. A role replica whose parallelism needs more GPUs spans "
        "parallelism / perNode nodes (one LeaderWorkerSet group; docs/multinode.md).",
    )
    exclusive_topology: TopologyKey | None = Field(
        default=None,
        max_length=317,
        description="Node label key of a topology domain the cluster sets (a rack or NVLink "
        "domain label, not kubernetes.io/hostname). Set: every pod of a multi-node group lands "
        "on nodes sharing one value of it, one group per value (LeaderWorkerSet annotation "
        "leaderworkerset.sigs.k8s.io/exclusive-topology; docs/multinode.md). Single-node roles "
        "ignore it. null: groups are placed on any nodes of the product.",
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
        default=4,
        ge=1,
        le=MAX_GPUS_PER_REPLICA,
        description="--tp-size; GPUs per replica. Above spec.gpu.perNode it must be a multiple "
        "of it: the replica then spans tensorParallel / perNode nodes (--nnodes), rendered as "
        "one LeaderWorkerSet group (docs/multinode.md).",
    )
    attention_data_parallel: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_REPLICA,
        description="DP attention: attention data-parallel groups inside the TP group, one "
        "scheduler each, while the MoE stays tensor or expert parallel; shares the TP GPUs and "
        "must divide tensorParallel. Rendered as --dp-size N --enable-dp-attention (0.5.16) or "
        "--attn-dp-size N (0.5.23). null: none beyond what extraArgs say.",
    )
    expert_parallel: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GPUS_PER_REPLICA,
        description="--ep-size: MoE expert-parallel ranks inside the TP group; must divide "
        "tensorParallel. null: the release's default (1, or what extraArgs say).",
    )
    moe_all_to_all: MoeAllToAll | None = Field(
        default=None,
        description="--moe-a2a-backend: how tokens reach the experts of other ranks under "
        "expert parallelism (deepep for DeepEP across nodes). null: the release's default "
        "(none) or what extraArgs say.",
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
    kv_checksum: bool | None = Field(
        default=None,
        description="--disaggregation-enable-kv-checksum on both roles: prefill digests each "
        "request's KV pages (Adler-32) and decode verifies them, aborting a request whose KV "
        "arrived corrupted. null: on where the release has the flag (0.5.23 has it, 0.5.16 not); "
        "false: off; true: required (refused on a release without it). Cost: "
        "docs/engine-notes.md#kv-checksum.",
    )


class WorkloadSpec(ApiModel):
    """The capacity target the planner checks the KV pool against."""

    concurrent_sessions: int = Field(
        default=60, ge=1, le=1_000_000, description="Concurrent multi-turn sessions."
    )
    context_tokens: int = Field(
        default=80000, ge=1, le=MAX_CONTEXT_TOKENS, description="Context tokens per session."
    )
