"""Overlap and concurrency rules: the overlap scheduler under PD, batches beyond the CUDA graphs."""

from __future__ import annotations

from collections.abc import Iterator

from dsv4_operator.engine.releases import SourceLine
from dsv4_operator.engine.rules.catalogue import NOTES, Change, Hit, RuleContext, rule


@rule(
    "DSV4-R005",
    "overlap scheduler with PD disaggregation",
    "warning",
    reference="sglang #27938, PR #32209 (open); fixed since 0.5.14: PR #26380, PR #28039",
    reads=("engine.overlap.scheduler", "<role>.overrides.overlap"),
    related_fixes=(
        Change(
            "0.5.14",
            ref="PR #26380 (overlap-schedule write-after-read race)",
            proof=SourceLine("srt/managers/scheduler.py", "def _apply_war_barrier(self):"),
        ),
        Change(
            "0.5.14",
            ref="PR #28039 (PD decode speculative + grammar deadlock)",
            proof=SourceLine(
                "srt/disaggregation/decode.py",
                "overlap + spec + grammar is unsupported (would desync DP ranks).",
            ),
        ),
    ),
)
def overlap_scheduler_with_pd(ctx: RuleContext) -> Iterator[Hit]:
    for role, eff in ctx.roles.items():
        if eff.overlap_scheduler:
            overlap = ctx.spec.role(role).overrides.overlap
            field = (
                f"spec.{role}.overrides.overlap.scheduler"
                if overlap is not None and overlap.scheduler is not None
                else "spec.engine.overlap.scheduler"
            )
            yield Hit(
                field,
                f"overlap scheduler on for {role} with PD disaggregation: PD decode with overlap "
                "has deadlocked (watchdog kill) with DP attention and speculative decoding "
                "(sglang #27938; PR #32209 is not merged). Keep overlap.scheduler false unless "
                "you have load-tested this combination.",
            )


@rule(
    "DSV4-R006",
    "maxRunningRequests above cudaGraphMaxBs (eager fallback)",
    "warning",
    reference=f"{NOTES}#eager-decode-fallback",
    reads=(
        "engine.maxRunningRequests",
        "engine.cudaGraphMaxBs",
        "decode.overrides",
        "decode.attentionDataParallel",
    ),
)
def running_requests_above_graph_size(ctx: RuleContext) -> Iterator[Hit]:
    eff = ctx.roles["decode"]  # the decode graph size is what bounds eager fallback
    # Under DP attention each attention group runs its own batch of maxRunningRequests / dp
    # (pool_configurator.py requested_max_running_requests_per_worker) and its own graphs.
    per_group = eff.max_running_requests // max(eff.attention_dp, 1)
    if per_group > eff.cuda_graph_max_bs:
        flag = ctx.release.cuda_graph_max_bs_flag.get("decode", "--cuda-graph-max-bs")
        groups = f" / {eff.attention_dp} attention groups" if eff.attention_dp > 1 else ""
        yield Hit(
            "spec.engine.maxRunningRequests",
            f"decode maxRunningRequests {eff.max_running_requests}{groups} > cudaGraphMaxBs "
            f"{eff.cuda_graph_max_bs} ({flag}): batches above the captured size run the slow "
            'eager path (sglang:cuda_graph_passes_total{mode="decode_none"}). Raise '
            "cudaGraphMaxBs or lower maxRunningRequests.",
        )
