"""bench/scale.py's core at N = 3, every guard running: once every deployment has baked, an
idle window of four canary intervals makes no API write and no API read.

The fleet is the bench's own (a control plane with a scheduler and kwok, so engine pods become
Ready; engine doubles and leak taps behind every pod, dsv4_devcluster.fleet), with a 2 s canary
instead of 60 s. Nothing a user can see changes during the window (the verdict stays Pass, the
revision stays baked, the phase Ready), so the status must not be written: live counts belong
in metrics. The guards did run: the canary runs the window holds are counted and asserted. The
restart the bench times (first and last deployment reconciled) runs too.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.benches import load_bench

pytestmark = pytest.mark.integration

DEPLOYMENTS = 3
INTERVAL = "2s"
IDLE_SECONDS = 8.0  # four canary intervals


@pytest.mark.long(seconds=80)
def test_an_idle_fleet_with_every_guard_running_writes_nothing(tmp_path: Path) -> None:
    scale = load_bench("scale.py")
    plan = scale.Plan(
        DEPLOYMENTS,
        idle=IDLE_SECONDS,
        canary_interval=INTERVAL,
        bake_time="2s",
        quiet_seconds=3.0,
        without=False,  # the API server alone: nothing of the operator's to assert
    )
    figures = asyncio.run(scale.measure(plan, tmp_path))

    # The guards ran through the window (four canary runs each are due; a loaded machine
    # falls behind, so at least one each on average).
    assert figures.canary_runs >= DEPLOYMENTS, figures
    assert figures.idle_calls.get("dsv4_reconciles_total", 0) > 0, figures  # passes still ran
    # The default spec's canary is run by the router pods' taps (`dsv4 tap`, POST /canary),
    # never by the operator itself while they answer.
    assert figures.idle_calls.get("dsv4_canary_runs_total tap", 0) >= DEPLOYMENTS, figures
    assert figures.idle_calls.get("dsv4_canary_runs_total operator", 0) == 0, figures
    writes, reads = figures.calls("write"), figures.calls("read")
    # The one read by design: whether the ServiceMonitor API appeared, every 5 min (cache.py).
    reads.pop("get discovery", None)
    assert writes == {}, f"API writes while nothing a user sees changed: {writes}"
    assert reads == {}, f"API reads outside the watch cache: {reads}"
    assert figures.rss_mb > 0
    # Each guard read and canary run took a slot, and the bench read their waits per window:
    # reads from creation to baked (every engine and tap read at least once, each wait and
    # each read's time told), canary runs idle.
    inf, up = float("inf"), figures.slots["bring-up"]
    assert up["reads waited"][inf] >= 2 * DEPLOYMENTS, figures.slots
    # (A read still in flight at the window's end has waited and not yet held.)
    assert 2 * DEPLOYMENTS <= up["reads held"][inf] <= up["reads waited"][inf], figures.slots
    # A deployment's canary runs one at a time, so at most one run each took its slot before
    # the window and was counted in it.
    canary_waits = figures.slots["idle"]["canary waited"][inf]
    assert canary_waits >= max(1, figures.canary_runs - DEPLOYMENTS), figures.slots
    # The creation windows were timed: the plain apply's, bench/ideal_controller.py's (it made
    # every child, or its window would have timed out) and the operator's, each with its CPU.
    assert min(figures.floor_s, figures.ideal_s, figures.operator_s) > 0, figures
    assert figures.ideal_cpu.get("ideal controller", 0) > 0, figures.ideal_cpu
    assert figures.operator_cpu.get("operator", 0) > 0, figures.operator_cpu
    assert 0 < figures.first_reconciled_s <= figures.all_reconciled_s, figures
