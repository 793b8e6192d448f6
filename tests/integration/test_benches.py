"""The benchmarks that start their own control plane still run: bench/apply_to_children.py
and bench/scale.py at their smallest size (about a minute together). Their figures are for
people to read; what is asserted is that they were measured, and the one property the scale
bench reports that must hold at any size: an idle operator that still resyncs writes nothing."""

from __future__ import annotations

import re

import pytest

from tests.support.benches import run_bench

FIGURE = r"(\d+\.\d+)"


def test_the_apply_bench_times_each_run_to_children_and_ready() -> None:
    out = run_bench("apply_to_children.py", "--runs", "2")
    runs = re.findall(rf"^run (\d): children {FIGURE}s, Ready {FIGURE}s$", out, re.MULTILINE)
    assert [run for run, _, _ in runs] == ["1", "2"], out
    assert all(float(children) <= float(ready) for _, children, ready in runs), out
    assert re.search(rf"apply -> all children present: median {FIGURE}s, max {FIGURE}s over 2", out)
    assert re.search(rf"apply -> phase Ready \(kwok pods\): median {FIGURE}s", out), out


@pytest.mark.long(seconds=60)
def test_the_scale_bench_finds_an_idle_operator_resyncing_without_a_write() -> None:
    out = run_bench("scale.py", "--sizes", "2", "--idle", "4", "--resync", "1")
    # | N | children: operator vs plain | CPU idle | RSS | calls idle | writes idle | ...
    row = re.search(
        rf"^\| 2 \| {FIGURE} s vs {FIGURE} s \(.*?\) \| .*? \| (\d+) MB \| (\d+)[^|]* \| (\d+) \|"
        rf".* \| {FIGURE} s \|$",
        out,
        re.MULTILINE,
    )
    assert row is not None, out
    assert int(row[3]) > 0, "no resident memory measured"
    assert (int(row[4]), int(row[5])) == (0, 0), "API calls or writes while idle"
    passes = re.search(r"reconcile passes during the idle window: N=2: (\d+)", out)
    assert passes is not None and int(passes[1]) > 0, out  # resyncs ran, from the cache
