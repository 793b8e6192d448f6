"""The canary's default load: the decode engine's DP ranks x sessions per rank, capped by the
plan and the API's bound; an explicit size wins; the status says what runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.engine.canary_load import canary_load
from dsv4_operator.engine.planner import plan
from dsv4_operator.reconcile.decide import decide
from tests.support.builders import make_world

Variant = Callable[..., dict[str, Any]]
DP4 = {"decode.overrides": {"extraArgs": ["--dp-size", "4", "--enable-dp-attention"]}}


def _load(variant: Variant, changes: dict[str, Any]) -> Any:
    return canary_load(DSV4DeploymentSpec.model_validate(variant(changes)))


def test_canary_defaults_to_dp_ranks_times_per_rank(variant: Variant) -> None:
    assert _load(variant, {}).sessions == 9  # no DP setting: one rank
    load = _load(variant, DP4)
    assert (load.sessions, load.dp_ranks, load.explicit) == (36, 4, False)
    assert _load(variant, {**DP4, "guard.canary.sessionsPerRank": 2}).sessions == 8
    # --dp is the release's alias of --dp-size; 8 x 9 = 72 is above the CRD's bound
    dp8 = {"decode.overrides": {"extraArgs": ["--dp", "8", "--enable-dp-attention"]}}
    assert _load(variant, dp8).sessions == 64


def test_canary_default_is_capped_by_the_plan(variant: Variant) -> None:
    long = {"engine.contextLength": 2_000_000, "workload.contextTokens": 2_000_000}
    capacity = plan(DSV4DeploymentSpec.model_validate(variant(long))).roles["decode"]
    assert 0 < capacity.sessions_capacity < 9
    assert _load(variant, long).sessions == capacity.sessions_capacity


def test_an_explicit_canary_size_wins(variant: Variant) -> None:
    load = _load(variant, {**DP4, "guard.canary.sessions": 5})
    assert (load.sessions, load.explicit) == (5, True)


def test_status_says_what_the_canary_runs(variant: Variant) -> None:
    status = decide(make_world(variant(DP4))).status
    assert status.guard is not None and status.guard.canary_sessions == 36
    off = decide(make_world(variant({"guard.canary.enabled": False}))).status
    assert off.guard is None or off.guard.canary_sessions is None
