"""The engine double's bisection knobs: a leak that needs a configured combination of settings
(DSV4_DOUBLE_LEAK_WHEN) and noise in the first N chat requests only (DSV4_DOUBLE_LEAK_FIRST)."""

from __future__ import annotations

import pytest

from dsv4_engine_double.config import (
    CONFIGURED_LEAK,
    EARLY_NOISE,
    corruption_probability,
    leak_condition_holds,
    parse_config,
)
from dsv4_engine_double.examples import conversation
from dsv4_engine_double.expectations import binomial_band
from dsv4_engine_double.server import answer, conversation_rng

ARGV = ["--enable-hierarchical-cache", "--hicache-ratio", "2.0", "--kv-cache-dtype=fp8_e4m3"]
PAIR = "--enable-hierarchical-cache,SGLANG_DSV4_BF16_INDEX_K=1"


@pytest.mark.parametrize(
    ("condition", "holds"),
    [
        ("--enable-hierarchical-cache", True),
        ("--hicache-ratio=2.0", True),
        ("--hicache-ratio=3.0", False),
        ("--kv-cache-dtype=fp8_e4m3", True),  # the `--flag=value` spelling
        ("--kv-cache-dtype", True),
        ("--disable-overlap-schedule", False),
        ("SGLANG_DSV4_BF16_INDEX_K=1", True),
        ("SGLANG_DSV4_BF16_INDEX_K=0", False),
        ("SGLANG_DSV4_BF16_INDEX_K", True),
        ("SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", False),
    ],
)
def test_each_condition_reads_the_argv_or_the_env(condition: str, holds: bool) -> None:
    assert leak_condition_holds(condition, ARGV, {"SGLANG_DSV4_BF16_INDEX_K": "1"}) is holds


def test_the_configured_leak_needs_every_condition_and_ignores_the_load() -> None:
    # No capability: bf16 index-K is ignored, so the incident's faults stay off and the knob
    # alone stands for the culprit.
    env = {
        "DSV4_DOUBLE_LEAK_WHEN": PAIR,
        "DSV4_DOUBLE_LEAK_RATE": "0.3",
        "DSV4_DOUBLE_CAPABILITIES": "",
    }
    both = parse_config(ARGV, {**env, "SGLANG_DSV4_BF16_INDEX_K": "1"})
    assert both.faults == (CONFIGURED_LEAK,)
    assert corruption_probability(both, 1) == pytest.approx(0.3)
    assert corruption_probability(both, 200) == pytest.approx(0.3)
    only_flag = parse_config(ARGV, env)
    only_env = parse_config([], {**env, "SGLANG_DSV4_BF16_INDEX_K": "1"})
    for half in (only_flag, only_env):
        assert CONFIGURED_LEAK not in half.faults
        assert corruption_probability(half, 200) == 0.0
    assert parse_config(ARGV, {}).faults == ()


def test_the_configured_leak_shows_in_answers_at_its_rate() -> None:
    env = {"DSV4_DOUBLE_LEAK_WHEN": "--enable-hierarchical-cache", "DSV4_DOUBLE_LEAK_RATE": "0.2"}
    config = parse_config(ARGV, env)
    bodies = [conversation(i) for i in range(400)]
    leaks = sum(
        answer(config, b, conversation_rng(config.seed, b), 1, 10).shape is not None for b in bodies
    )
    low, high = binomial_band(len(bodies), 0.2)
    assert 0 < low <= leaks <= high


def test_early_noise_leaks_in_the_first_requests_only() -> None:
    config = parse_config([], {"DSV4_DOUBLE_LEAK_FIRST": "50", "DSV4_DOUBLE_LEAK_RATE": "0.5"})
    assert config.faults == ()  # no setting is to blame
    assert config.fault_probabilities(1, 1) == {EARLY_NOISE: 0.5}
    assert config.fault_probabilities(1, 50) == {EARLY_NOISE: 0.5}
    assert config.fault_probabilities(1, 51) == {}
    bodies = [conversation(i) for i in range(100)]

    def leaked(body: dict[str, object], number: int) -> bool:
        rng = conversation_rng(config.seed, body)
        return answer(config, body, rng, 1, 10, number).shape is not None

    early = sum(leaked(b, n) for n, b in enumerate(bodies[:50], start=1))
    assert early > 10  # 0.5 x 50: about 25 (a tail of 1e-4 is at most 12)
    assert not any(leaked(b, n) for n, b in enumerate(bodies[50:], start=51))


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DSV4_DOUBLE_LEAK_WHEN": "--a,,B=1"}, "DSV4_DOUBLE_LEAK_WHEN"),
        ({"DSV4_DOUBLE_LEAK_WHEN": "-x"}, "DSV4_DOUBLE_LEAK_WHEN"),
        ({"DSV4_DOUBLE_LEAK_RATE": "1.5"}, "DSV4_DOUBLE_LEAK_RATE"),
        ({"DSV4_DOUBLE_LEAK_FIRST": "-1"}, "DSV4_DOUBLE_LEAK_FIRST"),
    ],
)
def test_bad_knobs_are_refused_naming_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(SystemExit, match=named):
        parse_config([], env)
