"""The effective engine configuration of one role: spec.engine merged with the role's overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import TypeVar

from dsv4_operator.api.roles import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.releases import Option, ParserCatalog, release

T = TypeVar("T")


# sglang's argparse aliases (docs/engine-notes.md), compared in their canonical form.
FLAG_ALIASES = {
    "--tp": "--tp-size",
    "--tensor-parallel-size": "--tp-size",
    "--dp": "--dp-size",
    "--data-parallel-size": "--dp-size",
    "--pipeline-parallel-size": "--pp-size",
    "--ep": "--ep-size",
    "--expert-parallel-size": "--ep-size",
    "--model": "--model-path",
    "--nccl-init-addr": "--dist-init-addr",
}


def normalize_flag(flag: str) -> str:
    """`--tp_size`, `--tp` and `--tp-size` are the same sglang flag; compare them in one form."""
    name = "--" + flag.lstrip("-").replace("_", "-")
    return FLAG_ALIASES.get(name, name)


def canonical_flag(token: str, catalog: ParserCatalog | None) -> tuple[str, Option | None]:
    """The flag a release's parser resolves `token` to (aliases and unambiguous prefixes
    included), spelled by its destination; unknown or ambiguous tokens only normalized."""
    if catalog is not None:
        resolution = catalog.resolve(token)
        if not resolution.unknown and not resolution.ambiguous:
            option = resolution.options[0]
            by_dest = "--" + option.dest.replace("_", "-")
            return (by_dest if by_dest in option.flags else option.flags[0]), option
    return normalize_flag(token), None


def parse_args(
    args: tuple[str, ...] | list[str], catalog: ParserCatalog | None = None
) -> dict[str, tuple[int, str | None]]:
    """Map each `--flag` in an argv fragment to (its index, its value or None for a switch).

    Accepts `--flag=value` and `--flag value`, and with a release's catalog every spelling its
    parser accepts (aliases, unambiguous prefixes). sglang takes no positionals, so a token
    that does not start with `--` is the value of the flag before it.
    """
    flags: dict[str, tuple[int, str | None]] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name, eq, inline = token.partition("=")
            flag, option = canonical_flag(name, catalog)
            switch = option is not None and not option.takes_value
            if eq:
                flags[flag] = (i, inline)
            elif not switch and i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[flag] = (i, args[i + 1])
                i += 1
            else:
                flags[flag] = (i, None)
        i += 1
    return flags


@dataclass(frozen=True)
class EffectiveRole:
    """Everything one role's engine is launched with, before the operator's own flags."""

    role: Role
    catalog: ParserCatalog | None
    tensor_parallel: int
    attention_data_parallel: int | None
    expert_parallel: int | None
    moe_all_to_all: str | None
    overlap_scheduler: bool
    cuda_graph_max_bs: int
    max_running_requests: int
    mem_fraction_static: float
    extra_args: tuple[str, ...]
    role_extra_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    @property
    def env_map(self) -> dict[str, str]:
        return dict(self.env)

    @cached_property
    def flags(self) -> Mapping[str, tuple[int, str | None]]:
        """Passthrough flags of the role (engine-wide first, role-specific win). Parsed once:
        the rules and the planner ask for them dozens of times per validation."""
        merged = parse_args(self.extra_args, self.catalog)
        merged.update(parse_args(self.role_extra_args, self.catalog))
        return MappingProxyType(merged)

    @property
    def speculative(self) -> bool:
        return "--speculative-algorithm" in self.flags

    def int_flag(self, name: str, default: int = 1) -> int:
        """A passthrough integer flag's value, or the default when unset or not a number."""
        value = self.flags.get(name, (0, None))[1]
        return int(value) if value is not None and value.isdigit() else default

    @property
    def attention_dp(self) -> int:
        """Attention data-parallel groups: spec.<role>.attentionDataParallel, else 0.5.23's
        --attn-dp-size, else --dp-size under --enable-dp-attention, else 1."""
        if self.attention_data_parallel is not None:
            return self.attention_data_parallel
        if "--attn-dp-size" in self.flags:
            return self.int_flag("--attn-dp-size")
        return self.int_flag("--dp-size") if "--enable-dp-attention" in self.flags else 1

    @property
    def expert_parallel_size(self) -> int:
        """MoE expert-parallel ranks: spec.<role>.expertParallel, else --ep-size, else 1."""
        if self.expert_parallel is not None:
            return self.expert_parallel
        return self.int_flag("--ep-size")

    @property
    def moe_a2a_backend(self) -> str:
        """The MoE all-to-all backend: spec.<role>.moeAllToAll, else --moe-a2a-backend, else
        the releases' default `none`."""
        if self.moe_all_to_all is not None:
            return self.moe_all_to_all
        return self.flags.get("--moe-a2a-backend", (0, None))[1] or "none"


def effective_role(spec: DSV4DeploymentSpec, role: Role) -> EffectiveRole:
    """Merge spec.engine with spec.<role>.overrides (a role's value wins)."""
    engine = spec.engine
    overrides = spec.role(role).overrides
    overlap = engine.overlap.scheduler
    if overrides.overlap is not None and overrides.overlap.scheduler is not None:
        overlap = overrides.overlap.scheduler
    env = {e.name: e.value for e in engine.env}
    env.update({e.name: e.value for e in overrides.env})
    engine_release = release(engine.sglang_version)
    role_spec = spec.role(role)
    return EffectiveRole(
        role=role,
        catalog=engine_release.engine if engine_release is not None else None,
        tensor_parallel=role_spec.tensor_parallel,
        attention_data_parallel=role_spec.attention_data_parallel,
        expert_parallel=role_spec.expert_parallel,
        moe_all_to_all=role_spec.moe_all_to_all,
        overlap_scheduler=overlap,
        cuda_graph_max_bs=_pick(overrides.cuda_graph_max_bs, engine.cuda_graph_max_bs),
        max_running_requests=_pick(overrides.max_running_requests, engine.max_running_requests),
        mem_fraction_static=_pick(overrides.mem_fraction_static, engine.mem_fraction_static),
        extra_args=tuple(engine.extra_args),
        role_extra_args=tuple(overrides.extra_args),
        env=tuple(sorted(env.items())),
    )


def _pick(override: T | None, default: T) -> T:
    return default if override is None else override


def gpus_needed(eff: EffectiveRole) -> int:
    """GPUs one replica of a role needs: tp x pp x (dp unless DP attention shares the TP GPUs)."""
    # 0.5.16's `--dp-size N --enable-dp-attention` (and the typed field, rendered that way
    # there) counts attention groups inside TP; 0.5.23's bare --dp-size counts whole replicas.
    attention = eff.attention_data_parallel is not None or "--enable-dp-attention" in eff.flags
    dp = 1 if attention else eff.int_flag("--dp-size")
    return eff.tensor_parallel * eff.int_flag("--pp-size") * dp
