"""The effective engine configuration of one role: spec.engine merged with the role's overrides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from dsv4_operator.api.spec import DSV4DeploymentSpec, Role

T = TypeVar("T")


# sglang's argparse aliases (reference 1.2), compared in their canonical form.
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


def parse_args(args: tuple[str, ...] | list[str]) -> dict[str, tuple[int, str | None]]:
    """Map each `--flag` in an argv fragment to (its index, its value or None for a switch).

    Accepts `--flag=value` and `--flag value`; sglang takes no positionals, so a token that
    does not start with `--` is the value of the flag before it.
    """
    flags: dict[str, tuple[int, str | None]] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name, eq, inline = token.partition("=")
            if eq:
                flags[normalize_flag(name)] = (i, inline)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                flags[normalize_flag(name)] = (i, args[i + 1])
                i += 1
            else:
                flags[normalize_flag(name)] = (i, None)
        i += 1
    return flags


@dataclass(frozen=True)
class EffectiveRole:
    """Everything one role's engine is launched with, before the operator's own flags."""

    role: Role
    tensor_parallel: int
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

    @property
    def flags(self) -> dict[str, tuple[int, str | None]]:
        """Passthrough flags of the role (engine-wide first, role-specific win)."""
        merged = parse_args(self.extra_args)
        merged.update(parse_args(self.role_extra_args))
        return merged

    @property
    def speculative(self) -> bool:
        return "--speculative-algorithm" in self.flags


def effective_role(spec: DSV4DeploymentSpec, role: Role) -> EffectiveRole:
    """Merge spec.engine with spec.<role>.overrides (a role's value wins)."""
    engine = spec.engine
    overrides = spec.role(role).overrides
    overlap = engine.overlap.scheduler
    if overrides.overlap is not None and overrides.overlap.scheduler is not None:
        overlap = overrides.overlap.scheduler
    env = {e.name: e.value for e in engine.env}
    env.update({e.name: e.value for e in overrides.env})
    return EffectiveRole(
        role=role,
        tensor_parallel=spec.role(role).tensor_parallel,
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
    flags = eff.flags

    def _int(name: str) -> int:
        value = flags.get(name, (0, None))[1]
        return int(value) if value is not None and value.isdigit() else 1

    dp = 1 if "--enable-dp-attention" in flags else _int("--dp-size")
    return eff.tensor_parallel * _int("--pp-size") * dp
