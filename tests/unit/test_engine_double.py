"""The engine test double: the operator's argv/env in, SGLang-like endpoints, faults as seeded.

Corruption follows a declared load (`DSV4_DOUBLE_LOAD` / the `X-DSV4-Double-Load` header) and a
hash of (seed, conversation), never the requests really in flight: these tests check that the
same inputs always give the same verdicts, whatever the timing.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from typing import Any

import pytest

from dsv4_engine_double import shapes
from dsv4_engine_double.config import (
    HICACHE_RACE,
    MULTI_STREAM_ALIASING,
    DoubleConfig,
    corruption_probability,
    parse_config,
    session_corruption_probability,
)
from dsv4_engine_double.examples import BF16_HICACHE, ROLE, conversation, corrupted, rendered
from dsv4_engine_double.expectations import binomial_band, leak_band
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.leak.classifier import classify_response

# --- configuration and the corruption curve (pure) ------------------------------------------


def test_the_rendered_argv_and_env_parse_with_their_values() -> None:
    args, env = rendered(BF16_HICACHE)
    config = parse_config(args, env)
    assert args[args.index("--max-total-tokens") + 1] == str(config.max_total_tokens)
    assert config.served_model_name == "deepseek-v4-flash"
    assert config.disaggregation_mode == ROLE
    assert config.tp_size == 4
    assert config.enable_metrics and config.enable_hierarchical_cache
    assert config.index_k_dtype == "bf16"
    assert config.faults == (HICACHE_RACE,)
    assert config.multi_stream_overlap is False  # the operator renders it off


def test_decode_reads_its_cuda_graph_bound_under_the_rendered_flag() -> None:
    """Every supported release names decode's bound `--cuda-graph-max-bs-decode`: the double
    runs a decode pass eager above it (what DSV4EagerDecodeFallback alerts on)."""
    args, env = rendered({}, role="decode")
    config = parse_config(args, env)
    assert config.cuda_graph_max_bs is not None
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == str(config.cuda_graph_max_bs)


def test_unknown_flags_are_tolerated_and_echoed() -> None:
    config = parse_config(
        ["--model-path", "m", "--page-size", "256", "--enable-foo", "--tp", "8"], {}
    )
    assert config.tp_size == 8
    assert config.unknown_args == ("--page-size", "256", "--enable-foo")


@pytest.mark.parametrize(
    ("changes", "capabilities", "faults"),
    [
        ({}, None, ()),  # the example: fp8, HiCache off
        (BF16_HICACHE, None, (HICACHE_RACE,)),
        (BF16_HICACHE, "bf16IndexK,indexKHiCacheGate", ()),
        ({**BF16_HICACHE, "engine.indexKDtype": "fp8"}, None, ()),
        ({**BF16_HICACHE, "engine.indexKDtype": "fp4"}, None, ()),
        (BF16_HICACHE, "poolSizingFix", ()),  # env ignored without bf16IndexK
        ({"engine.indexKDtype": "bf16", "engine.overlap.multiStream": True}, None,
         (MULTI_STREAM_ALIASING,)),
        ({"engine.indexKDtype": "bf16", "engine.overlap.multiStream": True},
         "bf16IndexK,multiStreamIndexKFix", ()),
    ],
)  # fmt: skip
def test_faults_follow_the_config(
    changes: dict[str, Any], capabilities: str | None, faults: tuple[str, ...]
) -> None:
    args, env = rendered(changes)
    if capabilities is not None:
        env["DSV4_DOUBLE_CAPABILITIES"] = capabilities
    assert parse_config(args, env).faults == faults


def test_multi_stream_overlap_defaults_on_like_upstream() -> None:
    env = {"SGLANG_DSV4_BF16_INDEX_K": "1", "DSV4_DOUBLE_CAPABILITIES": "bf16IndexK"}
    assert parse_config([], env).faults == (MULTI_STREAM_ALIASING,)


def test_the_load_is_declared_and_capped() -> None:
    default = parse_config([], {})
    assert (default.load, default.observe_load) == (1, False)  # undeclared: the lightest load
    assert parse_config([], {"DSV4_DOUBLE_LOAD": "60"}).load == 60
    capped = parse_config(["--max-running-requests", "48"], {"DSV4_DOUBLE_LOAD": "60"})
    assert capped.capped(capped.load) == 48
    observed = parse_config([], {"DSV4_DOUBLE_LOAD": "observed"})  # opt-in, never in tests
    assert observed.observe_load and observed.server_info()["observe_load"] is True
    for bad in ("0", "-3", "sixty", "1.5"):
        with pytest.raises(SystemExit, match="DSV4_DOUBLE_LOAD"):
            parse_config([], {"DSV4_DOUBLE_LOAD": bad})


HICACHE = DoubleConfig(
    bf16_index_k_requested=True,
    capabilities=frozenset({"bf16IndexK"}),
    enable_hierarchical_cache=True,
    multi_stream_overlap=False,
)
MULTI_STREAM = DoubleConfig(bf16_index_k_requested=True, capabilities=frozenset({"bf16IndexK"}))
CLEAN = DoubleConfig(enable_hierarchical_cache=True)  # fp8


def test_hicache_curve_matches_the_incident() -> None:
    assert corruption_probability(HICACHE, 1) == 0.0
    for running in (40, 60, 80):
        assert session_corruption_probability(HICACHE, running, 4) == pytest.approx(0.17, abs=0.01)
    loads = range(1, 81)
    values = [corruption_probability(HICACHE, c) for c in loads]
    assert values == sorted(values)  # never decreases with load


def test_multi_stream_degrades_with_load() -> None:
    values = [corruption_probability(MULTI_STREAM, c) for c in range(1, 81)]
    assert values[:8] == [0.0] * 8
    assert all(a < b for a, b in itertools.pairwise(values[8:]))
    assert session_corruption_probability(MULTI_STREAM, 80, 4) == pytest.approx(0.12, abs=0.01)


def test_both_faults_compound_and_clean_configs_never_corrupt() -> None:
    both = DoubleConfig(
        bf16_index_k_requested=True,
        capabilities=frozenset({"bf16IndexK"}),
        enable_hierarchical_cache=True,
    )
    p1, p2 = corruption_probability(HICACHE, 60), corruption_probability(MULTI_STREAM, 60)
    assert corruption_probability(both, 60) == pytest.approx(1 - (1 - p1) * (1 - p2))
    assert all(corruption_probability(CLEAN, c) == 0.0 for c in range(1, 200))


def test_the_leak_band_follows_the_curve() -> None:
    assert leak_band(HICACHE, 1, 60, 4) == (0, 0)  # 0% at C=1
    assert leak_band(CLEAN, 80, 60, 4) == (0, 0)  # fp8 never
    low, high = leak_band(HICACHE, 60, 60, 4)  # 17% of 60 sessions = 10.2 expected
    assert 0 < low < 10 < high < 60
    assert binomial_band(10, 1.0) == (10, 10)
    # All but 1e-4 of Binomial(n, q) on each side: about mean -/+ 3.72 sd (normal quantile).
    low, high = binomial_band(1000, 0.5)
    assert (low, high) == (441, 559)  # 500 -/+ 3.72 * 15.8, rounded inwards
    pmf = [math.comb(1000, k) / 2**1000 for k in range(1001)]
    assert sum(pmf[:low]) <= 1e-4 < sum(pmf[: low + 1])
    assert sum(pmf[high + 1 :]) <= 1e-4 < sum(pmf[high:])


def test_answers_are_a_function_of_seed_conversation_and_load() -> None:
    bodies = [conversation(i) for i in range(600)]
    at_60 = [corrupted(HICACHE, b, 60) for b in bodies]
    assert at_60 == [corrupted(HICACHE, b, 60) for b in bodies]  # same inputs, same verdicts
    # 600 single responses at p = 4.55%: within the curve's band, and never at a load <= 4.
    low, high = binomial_band(len(bodies), corruption_probability(HICACHE, 60))
    assert low <= sum(at_60) <= high
    assert not any(corrupted(HICACHE, b, 4) for b in bodies)
    # One uniform draw against a curve that never decreases: corrupted at 24 => at 60.
    at_24 = [corrupted(HICACHE, b, 24) for b in bodies]
    assert 0 < sum(at_24) < sum(at_60)
    assert all(high_ for low_, high_ in zip(at_24, at_60, strict=True) if low_)
    other_seed = dataclasses.replace(HICACHE, seed=1)
    assert at_60 != [corrupted(other_seed, b, 60) for b in bodies]


@pytest.mark.parametrize("shape", list(shapes.Shape))
def test_each_leak_shape_gets_its_expected_verdict(shape: shapes.Shape) -> None:
    for seed in range(20):
        rng = random.Random(seed)
        call = shapes.make_call(CANARY_TOOLS, rng.choice(shapes.tool_names(CANARY_TOOLS)), rng)
        message, finish = shapes.corrupted(shape, CANARY_TOOLS, call, rng)
        body = shapes.completion(message, finish, model="m", rng=rng)
        verdict = classify_response(body, tools=CANARY_TOOLS, must_call=True)
        assert verdict.kind.value == shapes.EXPECTED_KIND[shape], (shape, seed, verdict)
