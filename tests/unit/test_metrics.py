"""The guard's series follow what they describe (metrics.GuardMetrics)."""

from __future__ import annotations

import yaml
from prometheus_client import REGISTRY

from dsv4_operator import metrics
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.bisect.outcome import Outcome
from tests.support.paths import EXAMPLE

_EXAMPLE = yaml.safe_load(EXAMPLE.read_text())["spec"]
FP8 = DSV4DeploymentSpec.model_validate(_EXAMPLE)
BF16 = DSV4DeploymentSpec.model_validate(
    {**_EXAMPLE, "engine": {**_EXAMPLE["engine"], "indexKDtype": "bf16"}}
)


def _status(
    current: str, window: str | None = None, rate: float | None = None
) -> DSV4DeploymentStatus:
    guard = {"revision": window, "leakRate": rate} if window else None
    return DSV4DeploymentStatus.model_validate({"currentRevision": current, "guard": guard})


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _scope(key: tuple[str, str]) -> dict[str, str]:
    return {"namespace": key[0], "deployment": key[1]}


def _info(key: tuple[str, str], revision: str, dtype: str) -> float | None:
    return _value(
        "dsv4_revision_info",
        **_scope(key),
        revision=revision,
        index_k_dtype=dtype,
        hicache="false",
        multi_stream="false",
    )


def test_a_revision_no_longer_served_loses_its_series() -> None:
    guard, d = metrics.GuardMetrics(), ("ns", "rolled-back")
    guard.observe(d, BF16, _status("bad", "bad", 0.2), [], [])
    metrics.CANARY_RESPONSES.labels(*d, "bad", "leaked_markup").inc(3)
    assert _value("dsv4_leak_rate", **_scope(d), revision="bad") == 0.2
    assert _info(d, "bad", "bf16") == 1.0
    # Rolled back: the served revision is "good", with the config stored for it.
    guard.observe(d, FP8, _status("good", "good", 0.0), [], [])
    assert _value("dsv4_leak_rate", **_scope(d), revision="bad") is None
    assert _value("dsv4_leak_rate", **_scope(d), revision="good") == 0.0
    counts = {**_scope(d), "revision": "bad", "verdict": "leaked_markup"}
    assert _value("dsv4_canary_responses_total", **counts) is None
    assert _info(d, "bad", "bf16") is None
    assert _info(d, "good", str(FP8.engine.index_k_dtype)) == 1.0


def test_a_deleted_deployment_loses_every_series_and_only_its_own() -> None:
    guard = metrics.GuardMetrics()
    gone, stays = ("ns", "gone"), ("ns", "stays")
    for d in (gone, stays):
        guard.observe(d, FP8, _status("r1", "r1", 0.01), [], [])
        metrics.CANARY_LAST_RUN.labels(*d).set(1.0)
    guard.forget(gone)
    assert _value("dsv4_leak_rate", **_scope(gone), revision="r1") is None
    assert _value("dsv4_guard_blind", **_scope(gone)) is None
    assert _value("dsv4_quarantined_configs", **_scope(gone)) is None
    assert _value("dsv4_canary_last_run_timestamp_seconds", **_scope(gone)) is None
    assert _info(gone, "r1", str(FP8.engine.index_k_dtype)) is None
    assert _value("dsv4_leak_rate", **_scope(stays), revision="r1") == 0.01
    assert _value("dsv4_guard_blind", **_scope(stays)) == 0.0


def test_deployments_of_one_name_in_two_namespaces_are_two_series() -> None:
    """`namespace` and the bare `deployment` name (series.SCOPE), as the tap and the engines'
    scrape label them: forgetting one leaves the other."""
    guard = metrics.GuardMetrics()
    prod, staging = ("prod", "twin"), ("staging", "twin")
    guard.observe(prod, FP8, _status("r1", "r1", 0.01), [], [])
    guard.observe(staging, FP8, _status("r2", "r2", 0.05), [], [])
    assert _value("dsv4_leak_rate", **_scope(prod), revision="r1") == 0.01
    assert _value("dsv4_leak_rate", **_scope(staging), revision="r2") == 0.05
    guard.forget(staging)
    assert _value("dsv4_leak_rate", **_scope(staging), revision="r2") is None
    assert _value("dsv4_guard_blind", **_scope(prod)) == 0.0


def test_a_source_switched_off_loses_its_series_and_only_its_own() -> None:
    off, on = ("ns", "off"), ("ns", "on")
    for key in (off, on):
        metrics.CANARY_LAST_RUN.labels(*key).set(1.0)
        metrics.CANARY_RESPONSES.labels(*key, "r1", "ok").inc()
        metrics.TAPS_UNREACHABLE.labels(*key).set(0)
        metrics.ENGINES_UNREACHABLE.labels(*key).set(0)
    metrics.retire_sources(off, {"tap"})
    assert _value("dsv4_canary_last_run_timestamp_seconds", **_scope(off)) is None
    assert _value("dsv4_canary_responses_total", **_scope(off), revision="r1", verdict="ok") is None
    assert _value("dsv4_guard_engines_unreachable", **_scope(off)) is None
    assert _value("dsv4_guard_taps_unreachable", **_scope(off)) == 0
    assert _value("dsv4_canary_last_run_timestamp_seconds", **_scope(on)) == 1.0
    metrics.retire_sources(off, set())
    assert _value("dsv4_guard_taps_unreachable", **_scope(off)) is None
    for key in (off, on):
        metrics.GuardMetrics().forget(key)


def test_the_culprit_search_series_read_zero_before_any_search() -> None:
    guard, d = metrics.GuardMetrics(), ("ns", "never-bisected")
    guard.observe(d, FP8, _status("r1", "r1", 0.0), [], [])
    assert set(metrics.PROBE_OUTCOMES) == {o.value for o in Outcome}
    for outcome in metrics.PROBE_OUTCOMES:
        assert _value("dsv4_bisect_probes_total", **_scope(d), outcome=outcome) == 0.0
    assert _value("dsv4_bisect_shadow_pairs", **_scope(d)) == 0.0
    # A later pass keeps what a search counted.
    metrics.BISECT_PROBES.labels(*d, "fail").inc()
    guard.observe(d, FP8, _status("r1", "r1", 0.0), [], [])
    assert _value("dsv4_bisect_probes_total", **_scope(d), outcome="fail") == 1.0
    guard.forget(d)
    assert _value("dsv4_bisect_shadow_pairs", **_scope(d)) is None
