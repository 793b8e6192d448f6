"""Spec + plan -> the exact sglang argv and env of each role, and the router's argv."""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.limits import ENGINE_PORT, ROUTER_METRICS_PORT
from dsv4_operator.api.roles import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.effective import EffectiveRole, effective_role
from dsv4_operator.engine.planner import MemoryPlan
from dsv4_operator.engine.releases import EngineRelease
from dsv4_operator.engine.topology import topology_of

MODEL_MOUNT = "/models"  # where spec.model.cache is mounted; HF_HOME points here
ENGINE_ENTRYPOINT = ("python3", "-m", "sglang.launch_server")
ROUTER_ENTRYPOINT = ("python3", "-m", "sglang_router.launch_router")
KV_CHECKSUM_FLAG = "--disaggregation-enable-kv-checksum"
ATTN_DP_FLAG = "--attn-dp-size"  # 0.5.23; 0.5.16 spells it --dp-size N --enable-dp-attention


@dataclass(frozen=True)
class Launch:
    """A container's command line and environment."""

    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]


def kv_checksum_on(spec: DSV4DeploymentSpec, release: EngineRelease) -> bool:
    """Whether both roles render the KV checksum: spec.transfer.kvChecksum, null meaning on
    where the release has the flag (true on a release without it is DSV4-R023)."""
    wanted = spec.transfer.kv_checksum
    return release.has_flag(KV_CHECKSUM_FLAG) and wanted is not False


def served_name(spec: DSV4DeploymentSpec, profile_served_name: str) -> str:
    return spec.model.served_name or profile_served_name


def engine_launch(
    spec: DSV4DeploymentSpec, plan: MemoryPlan, role: Role, served_model_name: str
) -> Launch:
    """The engine argv and env of one role, spelled for the spec's SGLang release.

    docs/engine-notes.md ("Rendered flags") gives each flag's source per release.
    """
    eff = effective_role(spec, role)
    release = plan.profiles.release
    engine, transfer = spec.engine, spec.transfer
    args: list[str] = [
        *ENGINE_ENTRYPOINT,
        "--model-path", spec.model.name,
        "--served-model-name", served_model_name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--tp-size", str(eff.tensor_parallel),
        *parallel_args(eff, release, spec.gpu.per_node),
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", transfer.backend,
        "--disaggregation-bootstrap-port", str(transfer.bootstrap_port),
    ]  # fmt: skip
    if transfer.ib_devices:
        args += ["--disaggregation-ib-device", transfer.ib_devices]
    # Both roles or neither: the checksum adds a metadata buffer, paired by position.
    if kv_checksum_on(spec, release):
        args.append(KV_CHECKSUM_FLAG)
    args += [
        "--kv-cache-dtype", engine.kv_cache_dtype,
        "--mem-fraction-static", f"{eff.mem_fraction_static:g}",
        "--max-running-requests", str(eff.max_running_requests),
    ]  # fmt: skip
    # The decode graph size bounds eager fallback; prefill keeps its release's own default.
    graph_flag = release.cuda_graph_max_bs_flag.get(role)
    if graph_flag is not None:
        args += [graph_flag, str(eff.cuda_graph_max_bs)]
    args += [
        "--context-length", str(engine.context_length),
        # Pinned from the plan: the engine's own configurator may size index-K at 132 B.
        "--max-total-tokens", str(plan.roles[role].max_total_tokens),
        "--tool-call-parser", engine.tool_call_parser,
        "--reasoning-parser", engine.reasoning_parser,
        "--enable-metrics",
    ]  # fmt: skip
    if not eff.overlap_scheduler:
        args.append("--disable-overlap-schedule")
    # HiCache extends the radix cache, which PD decode disables: both releases refuse the two
    # together, so HiCache runs on prefill (docs/engine-notes.md#hicache-in-pd).
    if engine.hicache.enabled and role == "prefill":
        args += ["--enable-hierarchical-cache", "--hicache-ratio", f"{engine.hicache.ratio:g}"]
        if engine.hicache.size_gb > 0:
            args += ["--hicache-size", str(engine.hicache.size_gb)]
        args += ["--hicache-write-policy", engine.hicache.write_policy]
    if engine.index_k_dtype == "fp4":
        args.append("--enable-deepseek-v4-fp4-indexer")
    hub = spec.model.cache.hugging_face
    if hub is not None:
        args += ["--revision", hub.revision]
    args += [*eff.extra_args, *eff.role_extra_args]

    env = dict(eff.env)
    env["HF_HOME"] = MODEL_MOUNT
    if hub is not None:
        # The download Job verified the snapshot; the engines read it and never the network.
        env["HF_HUB_OFFLINE"] = "1"
    # Upstream defaults multi-stream overlap ON; the operator always states it explicitly.
    env["SGLANG_OPT_USE_MULTI_STREAM_OVERLAP"] = "1" if engine.overlap.multi_stream else "0"
    if Capability.BF16_INDEX_K in engine.capabilities:
        env["SGLANG_DSV4_BF16_INDEX_K"] = "1" if engine.index_k_dtype == "bf16" else "0"
    return Launch(command=tuple(args), env=tuple(sorted(env.items())))


def parallel_args(eff: EffectiveRole, release: EngineRelease, gpus_per_node: int) -> list[str]:
    """The typed parallelism beyond --tp-size, spelled for the release, and --nnodes for a
    replica that spans nodes (--node-rank and --dist-init-addr come from the group's pods)."""
    args: list[str] = []
    if eff.attention_data_parallel is not None:
        size = str(eff.attention_data_parallel)
        if release.has_flag(ATTN_DP_FLAG):
            args += [ATTN_DP_FLAG, size]
        else:
            args += ["--dp-size", size, "--enable-dp-attention"]
    if eff.expert_parallel is not None:
        args += ["--ep-size", str(eff.expert_parallel)]
    if eff.moe_all_to_all is not None:
        args += ["--moe-a2a-backend", eff.moe_all_to_all]
    nodes = topology_of(eff, gpus_per_node).nodes
    if nodes > 1:
        args += ["--nnodes", str(nodes)]
    return args


def router_launch(
    spec: DSV4DeploymentSpec, prefill_urls: list[str], decode_urls: list[str]
) -> Launch:
    """sgl-model-gateway in PD mode; each prefill carries its bootstrap port."""
    args: list[str] = [
        *ROUTER_ENTRYPOINT,
        "--pd-disaggregation",
        "--host", "0.0.0.0",
        "--port", str(spec.router.port),
        "--policy", spec.router.policy,
        "--prometheus-host", "0.0.0.0",
        "--prometheus-port", str(ROUTER_METRICS_PORT),
    ]  # fmt: skip
    for url in prefill_urls:
        args += ["--prefill", url, str(spec.transfer.bootstrap_port)]
    for url in decode_urls:
        args += ["--decode", url]
    return Launch(command=tuple(args), env=())
