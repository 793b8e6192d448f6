"""The capacity pin verified (pure): what each engine pod reports of itself against the plan
and the render of its revision.

The planner pins `--max-total-tokens` per role; the engine keeps the smaller of that and what
it measured it can hold, and reports the pool it built as `max_total_num_tokens` in
`/server_info` (0.5.16: `dataclasses.asdict(server_args)` plus the scheduler's info; 0.5.23:
`server_args.resolved_dict()` plus the same, and `version` in both). A smaller pool than
planned means the engine holds fewer sessions than the plan promised; another release than
the spec's means the flags and the pool arithmetic were chosen for another engine. The
resolved arguments the operator owns are compared with the rendered command line too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsv4_operator.api.roles import ROLES
from dsv4_operator.engine.flags import KV_CHECKSUM_FLAG
from dsv4_operator.pods import PodView
from dsv4_operator.reasons import ConditionReason

# Rendered flags the operator owns -> the server_args field /server_info reports them as.
# Only these are compared: the engine's resolution may rewrite what the operator leaves to it.
OWNED_ARGS: Mapping[str, str] = {
    "--tp-size": "tp_size",
    "--disaggregation-mode": "disaggregation_mode",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--mem-fraction-static": "mem_fraction_static",
    "--max-running-requests": "max_running_requests",
    "--context-length": "context_length",
    "--max-total-tokens": "max_total_tokens",
    "--tool-call-parser": "tool_call_parser",
    "--reasoning-parser": "reasoning_parser",
    KV_CHECKSUM_FLAG: "disaggregation_enable_kv_checksum",
}
ENDED_PHASES = ("Succeeded", "Failed")
# What the engine reports goes into a condition anyone who reads the object reads: short.
SHOWN_CHARS = 64


def rendered_args(command: Sequence[str]) -> dict[str, Any]:
    """The owned arguments of a rendered engine command: field -> value (True for a switch)."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(command):
        field = OWNED_ARGS.get(arg)
        if field is None:
            continue
        following = command[i + 1] if i + 1 < len(command) else None
        out[field] = True if following is None or following.startswith("--") else following
    return out


@dataclass(frozen=True)
class ServerInfo:
    """What one engine pod answered on /server_info, reduced to what is compared."""

    max_total_num_tokens: int | None
    version: str | None
    args: Mapping[str, Any]

    @classmethod
    def of(cls, reply: Mapping[str, Any]) -> ServerInfo:
        tokens = reply.get("max_total_num_tokens")
        version = reply.get("version")
        return cls(
            max_total_num_tokens=tokens if isinstance(tokens, int) else None,
            version=str(version) if version is not None else None,
            args={f: reply[f] for f in OWNED_ARGS.values() if f in reply},
        )


@dataclass(frozen=True)
class PlanExpectation:
    """What a revision's plan and render say its engines must report, per role."""

    revision: str
    sglang_version: str
    max_total_tokens: Mapping[str, int]
    args: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class PlanCheck:
    """The PlanVerified condition of one revision."""

    revision: str
    reason: ConditionReason
    message: str

    @property
    def verified(self) -> bool:
        return self.reason is ConditionReason.VERIFIED

    @property
    def mismatch(self) -> bool:
        return self.reason is ConditionReason.PLAN_MISMATCH


def _shown(value: Any) -> str:
    text = str(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _release(version: str) -> str:
    """`0.5.23+cu129` -> `0.5.23`: a local build label names the same release."""
    return version.split("+", 1)[0].strip()


def _same(reported: Any, rendered: Any) -> bool:
    """A reported server arg against its rendered text (numbers compared as numbers)."""
    if isinstance(rendered, bool) or isinstance(reported, bool):
        return bool(reported) == bool(rendered) if isinstance(reported, bool) else False
    if isinstance(reported, int | float):
        try:
            return math.isclose(float(reported), float(rendered), rel_tol=1e-9, abs_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return str(reported) == str(rendered)


def differences(info: ServerInfo, role: str, expected: PlanExpectation) -> list[str]:
    """What a pod of `role` reports that its revision's plan and render do not say."""
    found: list[str] = []
    planned = expected.max_total_tokens.get(role)
    if info.max_total_num_tokens != planned:
        got = info.max_total_num_tokens
        found.append(
            f"max_total_num_tokens {got if got is not None else 'none'}, the plan {planned}"
        )
    if info.version is None or _release(info.version) != expected.sglang_version:
        found.append(
            f"version {_shown(info.version or 'none')}, spec.engine.sglangVersion "
            f"{expected.sglang_version}"
        )
    for field, rendered in expected.args.get(role, {}).items():
        if field in info.args and not _same(info.args[field], rendered):
            found.append(f"{field} {_shown(info.args[field])}, rendered {rendered}")
    return found


def check_plan(
    expected: PlanExpectation, pods: Sequence[PodView], infos: Mapping[str, ServerInfo]
) -> PlanCheck:
    """PlanVerified for `expected.revision`: a mismatch on any pod wins; else every engine pod
    of the revision must have answered. Of a multi-node group, its leader: it reports the
    group's arguments and pool, and a worker serves no /server_info (docs/engine-notes.md,
    "Start-up")."""
    mine = [
        p
        for p in pods
        if p.revision == expected.revision
        and p.role in ROLES
        and p.worker_index == 0
        and p.phase not in ENDED_PHASES
    ]
    answered = [(p, infos[p.uid]) for p in mine if p.uid and p.uid in infos]
    wrong = [(p, d) for p, info in answered if (d := differences(info, str(p.role), expected))]
    revision = expected.revision
    if wrong:
        pod, found = wrong[0]
        more = f" (and {len(wrong) - 1} more pod(s))" if len(wrong) > 1 else ""
        return PlanCheck(
            revision,
            ConditionReason.PLAN_MISMATCH,
            f"engine pod {pod.name} ({pod.role}) of revision {revision} reports "
            f"{'; '.join(found)}{more}; not baked while this stands",
        )
    if not mine or len(answered) < len(mine):
        return PlanCheck(
            revision,
            ConditionReason.NOT_ANSWERED,
            f"{len(answered)} of {len(mine)} engine pod(s) of revision {revision} answered "
            "/server_info",
        )
    tokens = ", ".join(f"{r} {expected.max_total_tokens.get(r)}" for r in ROLES)
    return PlanCheck(
        revision,
        ConditionReason.VERIFIED,
        f"all {len(mine)} engine pod(s) of revision {revision} report the planned "
        f"max_total_num_tokens ({tokens}), the rendered arguments and SGLang "
        f"{expected.sglang_version}",
    )
