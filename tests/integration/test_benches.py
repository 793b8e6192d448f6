"""The benchmarks that start their own control plane still run: bench/apply_to_children.py and
bench/api_request_cost.py at their smallest sizes (bench/scale.py's core:
tests/integration/test_scale_bench.py, with what it must find at any size). Their figures are
for people to read; what is asserted is that they were measured, and of what they measured."""

from __future__ import annotations

import re

from tests.support.benches import run_bench

FIGURE = r"(\d+\.\d+)"


def test_the_apply_bench_times_each_run_to_children_and_ready() -> None:
    out = run_bench("apply_to_children.py", "--runs", "2")
    runs = re.findall(rf"^run (\d): children {FIGURE}s, Ready {FIGURE}s$", out, re.MULTILINE)
    assert [run for run, _, _ in runs] == ["1", "2"], out
    assert all(float(children) <= float(ready) for _, children, ready in runs), out
    assert re.search(rf"apply -> all children present: median {FIGURE}s, max {FIGURE}s over 2", out)
    assert re.search(rf"apply -> phase Ready \(kwok pods\): median {FIGURE}s", out), out


def test_the_request_cost_bench_prices_each_kind_of_request_a_create_makes() -> None:
    out = run_bench("api_request_cost.py", "--n", "5")
    rows = re.findall(rf"^\| ([^|]+?) \| {FIGURE} \|$", out, re.MULTILINE)
    assert [label for label, _ in rows] == [
        "DSV4Deployment create",
        "DSV4Deployment status, server-side apply",
        "DSV4Deployment status, merge patch",
        "Service (headless), server-side apply",
        "StatefulSet (0 replicas), server-side apply",
        "ControllerRevision create",
        "Event create",
    ], out
    assert sum(float(ms) for _, ms in rows) > 0, out  # the API server's CPU was read
    # Each batch did what its row prices (read back from the API server, not counted by the
    # bench): 5 of each, and the status written by both kinds of write.
    made = (
        "made: DSV4Deployment 5 (status Ready 5), Service 5, StatefulSet 5, "
        "ControllerRevision 5, Event 5"
    )
    assert made in out, out
