"""Memory planner: SGLang's DSV4/DSA pool arithmetic with the index-K size the image really uses.

Formulas follow reference 3.2-3.4 (`DSV4PoolConfigurator`, `DefaultPoolConfigurator`); the only
deliberate difference from the engine is that the indexer is sized with its actual dtype, which
is the seeds' pool-sizing bug (132 B assumed where bf16 uses 256).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsv4_operator.api.spec import ROLES, Capability, DSV4DeploymentSpec, IndexKDtype, Role
from dsv4_operator.engine.effective import EffectiveRole, effective_role
from dsv4_operator.engine.profiles import GpuProfile, ModelProfile, gpu_profiles, model_profiles

GIB = 1 << 30
# CUDA context, NCCL and custom all-reduce buffers live outside the weights but inside what the
# engine measures before sizing the pool. Estimate, on the safe side for one 4-8 GPU node.
RUNTIME_OVERHEAD_GIB = 1.5
# ReqToTokenPool holds one int32 per (request slot, context position) (sglang memory_pool.py).
REQ_TO_TOKEN_BYTES = 4
FP8_QUANT_BLOCK = 128  # reference 3.2/3.3: quant_block_size = 128, one fp32 scale per block
STATE_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2}  # reference 3.5


class PlanningError(ValueError):
    """The spec names a profile, GPU product or checkpoint the planner does not know."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def indexer_bytes_per_token(dtype: IndexKDtype, head_dim: int) -> int:
    """Bytes per token per C4 layer of the lightning-indexer keys (reference 3.3)."""
    if dtype == "fp8":
        return head_dim + head_dim // FP8_QUANT_BLOCK * 4  # 132 for head_dim 128
    if dtype == "bf16":
        return head_dim * 2  # 256: no scales (seeds 000/001)
    return head_dim // 2 + head_dim // 32  # fp4: 68 (get_dsv4_indexer_bytes_per_token)


@dataclass(frozen=True)
class Profiles:
    """The profiles a spec resolves to, with its overrides applied."""

    model: ModelProfile
    gpu: GpuProfile | None
    gpu_memory_gib: float
    weights_gib: float


def resolve_profiles(spec: DSV4DeploymentSpec) -> Profiles:
    """Look up the model and GPU profiles; raise PlanningError naming the field to fix."""
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
    return Profiles(model=model, gpu=gpu, gpu_memory_gib=gpu_gib, weights_gib=weights)


@dataclass(frozen=True)
class RolePlan:
    """The memory plan of one role, per rank (GPU) unless a name says otherwise."""

    role: Role
    replicas: int
    tensor_parallel: int
    gpu_memory_bytes: int
    static_budget_bytes: int
    weights_bytes: int
    reserve_bytes: int
    kv_pool_bytes: int
    pool_bytes: dict[str, float]
    bytes_per_full_token: float
    engine_bytes_per_full_token: float
    indexer_bytes_per_token: int
    max_total_tokens: int
    sessions_capacity: int
    workload_bytes: int
    unpatched_overcommit_bytes: int

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
            "gpuMemoryGiB": round(self.gpu_memory_bytes / GIB, 3),
            "staticBudgetGiB": round(self.static_budget_bytes / GIB, 3),
            "weightsPerRankGiB": round(self.weights_bytes / GIB, 3),
            "reserveGiB": round(self.reserve_bytes / GIB, 3),
            "kvPoolGiB": round(self.kv_pool_bytes / GIB, 3),
            "bytesPerFullToken": round(self.bytes_per_full_token, 2),
            "bytesPerFullTokenByPool": {k: round(v, 2) for k, v in self.pool_bytes.items()},
            "engineBytesPerFullToken": round(self.engine_bytes_per_full_token, 2),
            "indexerBytesPerToken": self.indexer_bytes_per_token,
            "maxTotalTokens": self.max_total_tokens,
            "sessionsCapacity": self.sessions_capacity,
            "headroomGiB": round(self.headroom_gib, 3),
            "unpatchedOvercommitBytes": self.unpatched_overcommit_bytes,
            "fits": self.fits,
        }


@dataclass(frozen=True)
class Plan:
    """Both roles' plans."""

    profiles: Profiles
    roles: dict[Role, RolePlan]

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.profiles.model.key,
            "gpuMemoryGiB": self.profiles.gpu_memory_gib,
            "weightsGiB": self.profiles.weights_gib,
            "roles": {role: p.as_dict() for role, p in self.roles.items()},
        }


def _dsv4_pool_bytes(
    model: ModelProfile, indexer: int, state_bytes: int, speculative: bool
) -> dict[str, float]:
    """Bytes per full token by pool (reference 3.4 `_get_bytes_per_full_token`)."""
    kv = model.qk_nope_head_dim + model.qk_rope_head_dim * 2 + 8  # 584, FP8 nope + BF16 rope
    attn_head_dim = model.qk_nope_head_dim + model.qk_rope_head_dim
    ring = model.c4_ring_size_speculative if speculative else model.c4_ring_size
    state_ratio = ring / model.state_page_size
    swa = model.swa_full_tokens_ratio
    pools = {
        "swa": swa * kv * model.layers,
        "c4": kv * model.c4_layers / 4,
        "c128": kv * model.c128_layers / 128,
        "indexer": indexer * model.c4_layers / 4,
        "c4State": swa * state_ratio * 2 * 2 * attn_head_dim * state_bytes * model.c4_layers,
        "c4IndexerState": swa
        * state_ratio
        * 2
        * 2
        * model.index_head_dim
        * state_bytes
        * model.c4_layers,
    }
    if speculative:  # draft layer reserve: (target + 1) / target
        pools = {k: v * (model.layers + 1) / model.layers for k, v in pools.items()}
    pools["total"] = sum(pools.values())
    return pools


def _c128_state_fixed_bytes(model: ModelProfile, slots: int, state_bytes: int, spec: bool) -> int:
    """Request-scoped C128 compress state (`_get_c128_state_fixed_bytes`, offline compression)."""
    if model.c128_layers == 0:
        return 0
    ring = model.c128_ring_size_speculative if spec else model.c128_ring_size
    rows = math.ceil((slots * ring + ring + 1) / 128) * 128
    return (
        rows
        * 2
        * (model.qk_nope_head_dim + model.qk_rope_head_dim)
        * state_bytes
        * (model.c128_layers)
    )


def _dsa_pool_bytes(model: ModelProfile, kv_dtype: str, indexer: int) -> dict[str, float]:
    """V3.2 `DefaultPoolConfigurator._compute_cell_size` with the actual indexer size."""
    if kv_dtype == "bfloat16":
        kv_layer = float((model.kv_lora_rank + model.qk_rope_head_dim) * 2)
    else:
        kv_layer = float(model.mla_fp8_kv_bytes_per_layer)
    pools = {"mla": kv_layer * model.layers, "indexer": float(indexer * model.layers)}
    pools["total"] = pools["mla"] + pools["indexer"]
    return pools


def _pool_bytes(
    spec: DSV4DeploymentSpec, model: ModelProfile, eff: EffectiveRole, indexer: int
) -> dict[str, float]:
    if model.family == "dsa":
        return _dsa_pool_bytes(model, spec.engine.kv_cache_dtype, indexer)
    state_bytes = STATE_DTYPE_BYTES.get(
        eff.env_map.get("SGLANG_DSV4_COMPRESS_STATE_DTYPE", "float32"), 4
    )
    return _dsv4_pool_bytes(model, indexer, state_bytes, eff.speculative)


def plan_role(spec: DSV4DeploymentSpec, profiles: Profiles, role: Role) -> RolePlan:
    """Plan one role per rank."""
    model = profiles.model
    eff = effective_role(spec, role)
    role_spec = spec.role(role)
    index_dtype = spec.engine.index_k_dtype
    actual_indexer = indexer_bytes_per_token(index_dtype, model.index_head_dim)
    pools = _pool_bytes(spec, model, eff, actual_indexer)
    bpt = pools["total"]
    # What the engine's own configurator reserves: the fp8 formula unless the image is fixed.
    if Capability.POOL_SIZING_FIX in spec.engine.capabilities:
        engine_bpt = bpt
    else:
        engine_bpt = _pool_bytes(
            spec, model, eff, indexer_bytes_per_token("fp8", model.index_head_dim)
        )["total"]

    gpu_bytes = int(profiles.gpu_memory_gib * GIB)
    static_budget = int(eff.mem_fraction_static * gpu_bytes)
    weights = int(profiles.weights_gib * GIB / eff.tensor_parallel)
    slots = eff.max_running_requests + 1  # `_get_num_req_slots`
    state_bytes = STATE_DTYPE_BYTES.get(
        eff.env_map.get("SGLANG_DSV4_COMPRESS_STATE_DTYPE", "float32"), 4
    )
    reserve = (
        int(RUNTIME_OVERHEAD_GIB * GIB)
        + _c128_state_fixed_bytes(model, slots, state_bytes, eff.speculative)
        + slots * spec.engine.context_length * REQ_TO_TOKEN_BYTES
    )
    kv_pool = static_budget - weights - reserve
    tokens = max(int(kv_pool / bpt), 0) // model.page_size * model.page_size
    context = spec.workload.context_tokens
    replicas = role_spec.replicas
    sessions_capacity = replicas * (tokens // context)
    sessions_per_replica = math.ceil(spec.workload.concurrent_sessions / max(replicas, 1))
    workload_bytes = int(sessions_per_replica * context * bpt)
    unpatched_tokens = max(int(kv_pool / engine_bpt), 0) // model.page_size * model.page_size
    overcommit = max(int(unpatched_tokens * (bpt - engine_bpt)), 0)
    return RolePlan(
        role=role,
        replicas=replicas,
        tensor_parallel=eff.tensor_parallel,
        gpu_memory_bytes=gpu_bytes,
        static_budget_bytes=static_budget,
        weights_bytes=weights,
        reserve_bytes=reserve,
        kv_pool_bytes=kv_pool,
        pool_bytes=pools,
        bytes_per_full_token=bpt,
        engine_bytes_per_full_token=engine_bpt,
        indexer_bytes_per_token=actual_indexer,
        max_total_tokens=tokens,
        sessions_capacity=sessions_capacity,
        workload_bytes=workload_bytes,
        unpatched_overcommit_bytes=overcommit,
    )


def plan(spec: DSV4DeploymentSpec) -> Plan:
    """Plan both roles; raises PlanningError for unknown profiles."""
    profiles = resolve_profiles(spec)
    return Plan(profiles=profiles, roles={role: plan_role(spec, profiles, role) for role in ROLES})
