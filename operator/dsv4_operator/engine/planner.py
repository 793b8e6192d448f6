"""Memory planner: SGLang's KV pool arithmetic for the spec's release, with the real index-K size.

The arithmetic per release lives in engine/pools.py; this module turns the spec into the
engine's settings and budget, and reports what the engine will hold and what an unpatched
configurator would over-commit (its index-K estimate is the fp8 size whatever the dtype).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import EffectiveRole, effective_role
from dsv4_operator.engine.kv_layout import (
    ATTN_BACKEND_FLAG,
    DEFAULT_LAYOUTS,
    KvLayouts,
    LayoutRefused,
    select_layouts,
)
from dsv4_operator.engine.pools import (
    STATE_DTYPE_BYTES,
    PoolSettings,
    PoolSizing,
    indexer_bytes_per_token,
    pool_sizing,
)
from dsv4_operator.engine.profiles import GpuProfile, ModelProfile, gpu_profiles, model_profiles
from dsv4_operator.engine.releases import EngineRelease, PoolArithmetic, release, versions_text
from dsv4_operator.engine.topology import topology_of

GIB = 1 << 30
# CUDA context, NCCL and custom all-reduce buffers live outside the weights but inside what the
# engine measures before sizing the pool. Estimate, on the safe side for one 4-8 GPU node.
RUNTIME_OVERHEAD_GIB = 1.5
# ReqToTokenPool holds one int32 per (request slot, context position) (sglang memory_pool.py).
REQ_TO_TOKEN_BYTES = 4
# PD decode reserves extra request slots for in-transfer requests when the per-worker batch is
# small (pd_disaggregation_hook.py: 2x the batch up to 32, else 0).
SMALL_BATCH = 32


class PlanningError(ValueError):
    """The spec names a release, profile, GPU product or checkpoint the planner does not know."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Profiles:
    """The profiles a spec resolves to, with its overrides applied."""

    model: ModelProfile
    gpu: GpuProfile | None
    gpu_memory_gib: float
    weights_gib: float
    release: EngineRelease


def resolve_profiles(spec: DSV4DeploymentSpec) -> Profiles:
    """Look up the release and the profiles; raise PlanningError naming the field to fix."""
    engine_release = release(spec.engine.sglang_version)
    if engine_release is None:
        raise PlanningError(
            "spec.engine.sglangVersion",
            f"SGLang {spec.engine.sglang_version} is not a supported release; use one of "
            f"{versions_text()} (the release your engine image is built on)",
        )
    models = model_profiles()
    model = models.get(spec.model.profile)
    if model is None:
        raise PlanningError(
            "spec.model.profile",
            f"unknown model profile {spec.model.profile!r}; use one of {', '.join(sorted(models))}",
        )
    gpu = gpu_profiles().get(spec.gpu.product)
    if spec.gpu.memory_gib is not None:
        gpu_gib = spec.gpu.memory_gib
    elif gpu is not None:
        gpu_gib = gpu.memory_gib
    else:
        raise PlanningError(
            "spec.gpu.product",
            f"unknown GPU product {spec.gpu.product!r}: set spec.gpu.memoryGiB, or use one of "
            f"{', '.join(sorted(gpu_profiles()))}",
        )
    if spec.model.weights_gib is not None:
        weights = spec.model.weights_gib
    else:
        checkpoint = spec.model.checkpoint or model.default_checkpoint
        if checkpoint not in model.checkpoints:
            raise PlanningError(
                "spec.model.checkpoint",
                f"profile {model.key} has no checkpoint format {checkpoint!r}; use one of "
                f"{', '.join(sorted(model.checkpoints))}, or set spec.model.weightsGiB",
            )
        weights = model.checkpoints[checkpoint]
    return Profiles(
        model=model, gpu=gpu, gpu_memory_gib=gpu_gib, weights_gib=weights, release=engine_release
    )


@dataclass(frozen=True)
class RolePlan:
    """The memory plan of one role, per rank (GPU) unless a name says otherwise."""

    role: Role
    replicas: int
    tensor_parallel: int
    attention_data_parallel: int
    expert_parallel: int
    nodes_per_replica: int
    gpus_per_pod: int
    gpu_memory_bytes: int
    static_budget_bytes: int
    weights_bytes: int
    reserve_bytes: int
    available_bytes: int
    sizing: PoolSizing
    engine_sizing: PoolSizing
    indexer_bytes_per_token: int
    max_total_tokens: int
    swa_tokens: int
    sessions_capacity: int
    workload_bytes: int
    unpatched_overcommit_bytes: int

    @property
    def bytes_per_full_token(self) -> float:
        return self.sizing.bytes_per_full_token

    @property
    def engine_bytes_per_full_token(self) -> float:
        return self.engine_sizing.bytes_per_full_token

    @property
    def kv_pool_bytes(self) -> int:
        """Bytes of the token-scaled pools (the budget less the fixed, request-scoped ones)."""
        return int(self.available_bytes - self.sizing.fixed_bytes)

    @property
    def fits(self) -> bool:
        """Weights and reserve leave room for at least one page of KV."""
        return self.max_total_tokens > 0

    @property
    def headroom_gib(self) -> float:
        """KV pool beyond what the workload's share of sessions needs on one rank."""
        return (self.kv_pool_bytes - self.workload_bytes) / GIB

    def as_dict(self) -> dict[str, object]:
        """The JSON shape of `dsv4 plan -o json` (camelCase, like the API)."""
        return {
            "replicas": self.replicas,
            "tensorParallel": self.tensor_parallel,
            "attentionDataParallel": self.attention_data_parallel,
            "expertParallel": self.expert_parallel,
            "nodesPerReplica": self.nodes_per_replica,
            "gpusPerPod": self.gpus_per_pod,
            "gpuMemoryGiB": round(self.gpu_memory_bytes / GIB, 3),
            "staticBudgetGiB": round(self.static_budget_bytes / GIB, 3),
            "weightsPerRankGiB": round(self.weights_bytes / GIB, 3),
            "reserveGiB": round(self.reserve_bytes / GIB, 3),
            "kvPoolGiB": round(self.kv_pool_bytes / GIB, 3),
            "bytesPerFullToken": round(self.bytes_per_full_token, 2),
            "bytesPerFullTokenByPool": {
                k: round(v, 2)
                for k, v in {**self.sizing.per_token, "total": self.bytes_per_full_token}.items()
            },
            "fixedPoolBytes": {k: int(v) for k, v in self.sizing.fixed.items()},
            "engineBytesPerFullToken": round(self.engine_bytes_per_full_token, 2),
            "indexerBytesPerToken": self.indexer_bytes_per_token,
            "maxTotalTokens": self.max_total_tokens,
            "swaTokens": self.swa_tokens,
            "sessionsCapacity": self.sessions_capacity,
            "headroomGiB": round(self.headroom_gib, 3),
            "unpatchedOvercommitBytes": self.unpatched_overcommit_bytes,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class MemoryPlan:
    """Both roles' memory plans, for the spec's SGLang release."""

    profiles: Profiles
    roles: dict[Role, RolePlan]

    @property
    def sglang_version(self) -> str:
        return self.profiles.release.version

    def as_dict(self) -> dict[str, object]:
        return {
            "sglangVersion": self.sglang_version,
            "model": self.profiles.model.key,
            "gpuMemoryGiB": self.profiles.gpu_memory_gib,
            "weightsGiB": self.profiles.weights_gib,
            "roles": {role: p.as_dict() for role, p in self.roles.items()},
        }


def select_role_layouts(eff: EffectiveRole, profiles: Profiles) -> KvLayouts:
    """The paged KV layouts a role's settings select on the spec's release and GPU; raises
    LayoutRefused where the release would refuse them (DSV4-R024)."""
    if profiles.release.pool_arithmetic is not PoolArithmetic.PAGED:
        return DEFAULT_LAYOUTS  # one layout only: the release has no layout settings
    backend = eff.flags.get(ATTN_BACKEND_FLAG, (0, None))[1]
    arch = profiles.gpu.compute_capability if profiles.gpu is not None else None
    return select_layouts(eff.env_map, backend, arch)


def role_layouts(eff: EffectiveRole, profiles: Profiles) -> KvLayouts:
    """The layouts the planner plans with: the default where the release refuses the settings
    (the spec is refused then, so no engine runs with them)."""
    try:
        return select_role_layouts(eff, profiles)
    except LayoutRefused:
        return DEFAULT_LAYOUTS


def pool_settings(
    eff: EffectiveRole, indexer_bytes: int, kv_layouts: KvLayouts = DEFAULT_LAYOUTS
) -> PoolSettings:
    """The engine settings the pool arithmetic reads, as the release resolves them."""
    mrr = eff.max_running_requests // eff.attention_dp
    return PoolSettings(
        indexer_bytes=indexer_bytes,
        state_bytes=STATE_DTYPE_BYTES.get(
            eff.env_map.get("SGLANG_DSV4_COMPRESS_STATE_DTYPE", "float32"), 4
        ),
        speculative=eff.speculative,
        max_running_requests=mrr,
        mode=eff.role,
        decode_extra_slots=2 * max(1, mrr) if mrr <= SMALL_BATCH else 0,
        kv_layouts=kv_layouts,
    )


def weights_per_rank_bytes(profiles: Profiles, eff: EffectiveRole) -> int:
    """Weight bytes on one rank: the routed experts split over all TP ranks (expert-parallel
    ranks x MoE-TP ranks = tp_size, sglang runtime_context moe_tp_size_of), everything else over
    the attention-TP group (tp_size / attention DP), which DP attention narrows."""
    total = profiles.weights_gib * GIB
    non_expert = min(profiles.model.non_expert_weights_gib * GIB, total)
    attention_tp = max(eff.tensor_parallel // max(eff.attention_dp, 1), 1)
    return int((total - non_expert) / eff.tensor_parallel + non_expert / attention_tp)


def plan_role(spec: DSV4DeploymentSpec, profiles: Profiles, role: Role) -> RolePlan:
    """Plan one role per rank."""
    model, arithmetic = profiles.model, profiles.release.pool_arithmetic
    eff = effective_role(spec, role)
    role_spec = spec.role(role)
    actual_indexer = indexer_bytes_per_token(spec.engine.index_k_dtype, model.index_head_dim)
    settings = pool_settings(eff, actual_indexer, role_layouts(eff, profiles))
    sizing = pool_sizing(arithmetic, model, spec.engine.kv_cache_dtype, settings)
    # What the engine's own configurator reserves: the fp8 formula unless the image is fixed.
    if Capability.POOL_SIZING_FIX in spec.engine.capabilities:
        engine_sizing = sizing
    else:
        fp8 = indexer_bytes_per_token("fp8", model.index_head_dim)
        engine_sizing = pool_sizing(
            arithmetic,
            model,
            spec.engine.kv_cache_dtype,
            dataclasses.replace(settings, indexer_bytes=fp8),
        )

    gpu_bytes = int(profiles.gpu_memory_gib * GIB)
    static_budget = int(eff.mem_fraction_static * gpu_bytes)
    weights = weights_per_rank_bytes(profiles, eff)
    slots = settings.max_running_requests + 1
    outside = (
        int(RUNTIME_OVERHEAD_GIB * GIB) + slots * spec.engine.context_length * REQ_TO_TOKEN_BYTES
    )
    available = static_budget - weights - outside
    true_tokens = sizing.full_tokens(available, model.page_size)
    engine_tokens = engine_sizing.full_tokens(available, model.page_size)
    # The engine keeps the smaller of --max-total-tokens and its own estimate, so the plan is
    # the smaller of the true fit and what the engine would size itself.
    tokens = min(true_tokens, engine_tokens)
    context = spec.workload.context_tokens
    replicas = role_spec.replicas
    # Each attention-DP group holds the KV of its own requests in its own pool; without DP
    # attention every TP rank holds the same (MLA) KV, so a replica holds one rank's tokens.
    pools = max(replicas, 1) * eff.attention_dp
    sessions_per_pool = math.ceil(spec.workload.concurrent_sessions / pools)
    overcommit = engine_tokens * (sizing.bytes_per_full_token - engine_sizing.bytes_per_full_token)
    topology = topology_of(eff, spec.gpu.per_node)
    return RolePlan(
        role=role,
        replicas=replicas,
        tensor_parallel=eff.tensor_parallel,
        attention_data_parallel=eff.attention_dp,
        expert_parallel=eff.expert_parallel_size,
        nodes_per_replica=topology.nodes,
        gpus_per_pod=topology.gpus_per_pod,
        gpu_memory_bytes=gpu_bytes,
        static_budget_bytes=static_budget,
        weights_bytes=weights,
        reserve_bytes=outside + int(sizing.fixed_bytes),
        available_bytes=available,
        sizing=sizing,
        engine_sizing=engine_sizing,
        indexer_bytes_per_token=actual_indexer,
        max_total_tokens=tokens,
        swa_tokens=sizing.swa_tokens(tokens, model.page_size),
        sessions_capacity=replicas * eff.attention_dp * (tokens // context),
        workload_bytes=int(sessions_per_pool * context * sizing.bytes_per_full_token),
        unpatched_overcommit_bytes=max(int(overcommit), 0),
    )


def plan(spec: DSV4DeploymentSpec) -> MemoryPlan:
    """Plan both roles; raises PlanningError for an unknown release or profile."""
    profiles = resolve_profiles(spec)
    return MemoryPlan(
        profiles=profiles, roles={role: plan_role(spec, profiles, role) for role in ROLES}
    )
