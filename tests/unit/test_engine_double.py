"""The engine test double: the operator's argv/env in, SGLang-like endpoints, faults as seeded.

Corruption follows a declared load (`DSV4_DOUBLE_LOAD` / the `X-DSV4-Double-Load` header) and a
hash of (seed, conversation), never the requests really in flight: these tests check that the
same inputs always give the same verdicts, whatever the timing.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import json
import math
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.probe.canary import CANARY_TOOLS
from dsv4_operator.probe.dsml import VerdictKind, assemble_stream, classify
from dsv4_operator.render.children import render_spec
from tests.engine_double import shapes
from tests.engine_double.config import (
    HICACHE_RACE,
    LOAD_HEADER,
    MULTI_STREAM_ALIASING,
    DoubleConfig,
    corruption_probability,
    parse_config,
    session_corruption_probability,
)
from tests.engine_double.expectations import binomial_band, leak_band
from tests.engine_double.process import DoubleFailedToStart, DoubleProcess, launch_from_statefulset
from tests.engine_double.server import answer, conversation_rng

from .conftest import EXAMPLE, set_path

Doc = dict[str, Any]
BF16_HICACHE = {
    "engine.indexKDtype": "bf16",
    "engine.hicache": {"enabled": True, "ratio": 2.0},
}


# HiCache is rendered on the prefill role (PD decode disables the radix cache it extends), so
# the HiCache tests run the prefill engine's argv.
ROLE = "prefill"


def rendered(changes: dict[str, Any], role: str = ROLE) -> tuple[list[str], dict[str, str]]:
    """Argv and env of the example's engine StatefulSet for `role`, with `changes` applied."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    spec = copy.deepcopy(doc["spec"])
    for dotted, value in changes.items():
        set_path(spec, dotted, value)
    model = DSV4DeploymentSpec.model_validate(spec)
    manifests = render_spec("dsv4-flash", "default", model)
    sts = next(
        m
        for m in manifests
        if m["kind"] == "StatefulSet" and m["metadata"]["name"] == f"dsv4-flash-{role}"
    )
    return launch_from_statefulset(sts, [c.value for c in model.engine.capabilities])


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


def _conversation(i: int) -> Doc:
    return {
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": f"Conversation {i}: weather in Oslo, then docs."}],
        "tools": CANARY_TOOLS,
    }


def _corrupted(config: DoubleConfig, body: Doc, load: int) -> bool:
    return answer(config, body, conversation_rng(config.seed, body), load, 10).shape is not None


def test_answers_are_a_function_of_seed_conversation_and_load() -> None:
    bodies = [_conversation(i) for i in range(600)]
    at_60 = [_corrupted(HICACHE, b, 60) for b in bodies]
    assert at_60 == [_corrupted(HICACHE, b, 60) for b in bodies]  # same inputs, same verdicts
    # 600 single responses at p = 4.55%: within the curve's band, and never at a load <= 4.
    low, high = binomial_band(len(bodies), corruption_probability(HICACHE, 60))
    assert low <= sum(at_60) <= high
    assert not any(_corrupted(HICACHE, b, 4) for b in bodies)
    # One uniform draw against a curve that never decreases: corrupted at 24 => at 60.
    at_24 = [_corrupted(HICACHE, b, 24) for b in bodies]
    assert 0 < sum(at_24) < sum(at_60)
    assert all(high_ for low_, high_ in zip(at_24, at_60, strict=True) if low_)
    other_seed = dataclasses.replace(HICACHE, seed=1)
    assert at_60 != [_corrupted(other_seed, b, 60) for b in bodies]


@pytest.mark.parametrize("shape", list(shapes.Shape))
def test_each_leak_shape_gets_its_expected_verdict(shape: shapes.Shape) -> None:
    for seed in range(20):
        rng = random.Random(seed)
        call = shapes.make_call(CANARY_TOOLS, rng.choice(shapes.tool_names(CANARY_TOOLS)), rng)
        message, finish = shapes.corrupted(shape, CANARY_TOOLS, call, rng)
        body = shapes.completion(message, finish, model="m", rng=rng)
        verdict = classify(body, tools=CANARY_TOOLS, must_call=True)
        assert verdict.kind.value == shapes.EXPECTED_KIND[shape], (shape, seed, verdict)


# --- the server -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_hicache() -> Iterator[DoubleProcess]:
    args, env = rendered(BF16_HICACHE)
    env["DSV4_DOUBLE_LATENCY_MS"] = "5"
    with DoubleProcess(args, env) as double:
        yield double


def chat(url: str, messages: list[Doc], **extra: Any) -> httpx.Response:
    body = {"model": "deepseek-v4-flash", "messages": messages, "tools": CANARY_TOOLS, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)


USER = [{"role": "user", "content": "Check the weather in Oslo, then search the docs."}]


def test_chat_answers_with_a_structured_tool_call(bf16_hicache: DoubleProcess) -> None:
    reply = chat(bf16_hicache.url, USER)
    assert reply.status_code == 200
    body = reply.json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"]  # --reasoning-parser is rendered
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] in shapes.tool_names(CANARY_TOOLS)
    json.loads(call["function"]["arguments"])
    assert classify(body, tools=CANARY_TOOLS, must_call=True).kind is VerdictKind.OK


def test_after_a_tool_result_it_calls_again_and_streams(bf16_hicache: DoubleProcess) -> None:
    first = chat(bf16_hicache.url, USER).json()["choices"][0]["message"]
    call = first["tool_calls"][0]
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": first["tool_calls"]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature_c": 3}'},
    ]
    again = chat(bf16_hicache.url, messages).json()
    assert again["choices"][0]["finish_reason"] == "tool_calls"
    streamed = chat(bf16_hicache.url, messages, stream=True)
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.rstrip().endswith("data: [DONE]")
    assembled = assemble_stream(streamed.text)
    # Same conversation, same answer: draws depend on the seed and the conversation only.
    assert (
        assembled["choices"][0]["message"]["tool_calls"]
        == again["choices"][0]["message"]["tool_calls"]
    )
    assert classify(assembled, tools=CANARY_TOOLS, must_call=True).kind is VerdictKind.OK


def test_plain_answers_and_bad_requests(bf16_hicache: DoubleProcess) -> None:
    prose = chat(bf16_hicache.url, USER, tool_choice="none").json()["choices"][0]
    assert prose["finish_reason"] == "stop" and prose["message"]["tool_calls"] is None
    assert prose["message"]["content"]
    bad = httpx.post(f"{bf16_hicache.url}/v1/chat/completions", content=b"{", timeout=10)
    assert bad.status_code == 400 and bad.json()["object"] == "error"


def _leaky_conversation() -> Doc:
    """The first canary-like conversation the fixture's config corrupts at load 60."""
    config = parse_config(*rendered(BF16_HICACHE))
    assert config.faults == (HICACHE_RACE,), config.faults
    # p = 4.55% per response at 60: the first hit is a handful of conversations in (and the
    # same one every time); 1000 bounds the search should the curve ever drop to 0.
    return next(b for b in map(_conversation, range(1000)) if _corrupted(config, b, 60))


def test_the_declared_load_header_decides_not_the_overlap(bf16_hicache: DoubleProcess) -> None:
    body = _leaky_conversation()
    url = f"{bf16_hicache.url}/v1/chat/completions"

    def post(load: int | None) -> httpx.Response:
        headers = {LOAD_HEADER: str(load)} if load is not None else {}
        return httpx.post(url, json=body, headers=headers, timeout=10)

    def kind(reply: httpx.Response) -> VerdictKind:
        return classify(reply.json(), tools=CANARY_TOOLS, must_call=True).kind

    light, heavy, undeclared = post(1), post(60), post(None)
    assert kind(light) is VerdictKind.OK and light.headers[LOAD_HEADER] == "1"
    assert kind(heavy) is not VerdictKind.OK and heavy.headers[LOAD_HEADER] == "60"
    # The fixture declares no load: the default is 1, so the same conversation is clean.
    assert kind(undeclared) is VerdictKind.OK and undeclared.headers[LOAD_HEADER] == "1"
    cap = parse_config(*rendered(BF16_HICACHE)).max_running_requests
    assert cap is not None and post(1000).headers[LOAD_HEADER] == str(cap)  # capped

    async def burst(load: int, n: int) -> list[Doc]:
        async with httpx.AsyncClient(timeout=30, headers={LOAD_HEADER: str(load)}) as client:
            replies = await asyncio.gather(*(client.post(url, json=body) for _ in range(n)))
        return [r.json() for r in replies]

    # 40 at once (the server really runs 40) at a declared load of 1: still clean, and every
    # reply is the same; one at a time at 60: corrupted every time, the same way.
    crowd = [r["choices"] for r in asyncio.run(burst(1, 40))]
    assert crowd == [light.json()["choices"]] * 40
    alone = [asyncio.run(burst(60, 1))[0]["choices"] for _ in range(3)]
    assert alone == [heavy.json()["choices"]] * 3
    for bad in ("0", "many", "observed"):
        refused = httpx.post(url, json=body, headers={LOAD_HEADER: bad}, timeout=10)
        assert refused.status_code == 400 and LOAD_HEADER in refused.json()["message"]


def test_models_health_and_server_info(bf16_hicache: DoubleProcess) -> None:
    url = bf16_hicache.url
    models = httpx.get(f"{url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["deepseek-v4-flash"]
    assert httpx.get(f"{url}/health").status_code == 200
    assert httpx.get(f"{url}/health_generate").status_code == 200
    info = httpx.get(f"{url}/get_server_info").json()
    assert info["engine_double"] is True
    assert info["disaggregation_mode"] == ROLE and info["tp_size"] == 4
    assert info["index_k_dtype"] == "bf16" and info["faults"] == [HICACHE_RACE]
    assert info["load"] == 1 and info["observe_load"] is False
    assert info["host"] == "127.0.0.1"  # the appended override won over the rendered 0.0.0.0
    assert "a test double standing in for SGLang" in bf16_hicache.log
    assert "load=1 (declared" in bf16_hicache.log


REQUIRED_METRICS = {
    "sglang:num_running_reqs",
    "sglang:token_usage",
    "sglang:num_requests",
    "sglang:generation_tokens",
    "sglang:cuda_graph_passes",
    "sglang:num_retracted_requests",
    "sglang:num_transfer_failed_reqs",
    "sglang:num_bootstrap_failed_reqs",
    "sglang:time_to_first_token_seconds",
}


def _samples(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= REQUIRED_METRICS, REQUIRED_METRICS - set(families)
    assert families["sglang:time_to_first_token_seconds"].type == "histogram"
    samples: dict[str, float] = {}
    for family in families.values():
        for sample in family.samples:
            mode = sample.labels.get("mode")
            samples[sample.name + (f"[{mode}]" if mode else "")] = sample.value
    return samples


def test_metrics_have_real_sglang_names_and_count_requests(bf16_hicache: DoubleProcess) -> None:
    before = _samples(bf16_hicache.url)
    for _ in range(3):
        assert chat(bf16_hicache.url, USER).status_code == 200
    after = _samples(bf16_hicache.url)
    assert after["sglang:num_requests_total"] == before["sglang:num_requests_total"] + 3
    assert after["sglang:generation_tokens_total"] > before["sglang:generation_tokens_total"]
    assert after["sglang:time_to_first_token_seconds_count"] == (
        before["sglang:time_to_first_token_seconds_count"] + 3
    )
    graph = "sglang:cuda_graph_passes_total[decode_cuda_graph]"
    assert after[graph] > before[graph]
    assert after["sglang:num_running_reqs"] == 0.0
    assert after["sglang:max_total_num_tokens"] > 1_000_000  # the plan's --max-total-tokens


def test_metrics_are_off_without_enable_metrics() -> None:
    with DoubleProcess(["--served-model-name", "m"], {}) as double:
        assert httpx.get(f"{double.url}/metrics").status_code == 404


def test_health_is_503_while_starting() -> None:
    # An hour: the test is over long before, however slowly the machine runs.
    with DoubleProcess(["--served-model-name", "m"], {"DSV4_DOUBLE_STARTUP_S": "3600"}) as double:
        assert httpx.get(f"{double.url}/health").status_code == 503
        assert httpx.get(f"{double.url}/health_generate").status_code == 503


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    with DoubleProcess(["--context-length", "10"], {}) as double:
        reply = chat(double.url, USER)
        assert reply.status_code == 400
        assert "longer than the model's context length (10 tokens)" in reply.json()["message"]


# --- OOM ------------------------------------------------------------------------------------

OOM_LINES = (
    "Scheduler hit an exception: Traceback",
    "Received sigquit from a child process. It usually means the child failed.",
)


def test_cuda_oom_after_n_requests_kills_the_server() -> None:
    args, env = rendered({})
    env["DSV4_DOUBLE_OOM_AFTER"] = "2"
    double = DoubleProcess(args, env).start()
    try:
        assert chat(double.url, USER).status_code == 200
        assert chat(double.url, USER).status_code == 200
        with pytest.raises(httpx.TransportError):
            chat(double.url, USER)
        assert double.wait(10) == -9  # kill_process_tree: SIGKILL (137 in a container)
    finally:
        double.stop()
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in double.log
    for line in OOM_LINES:
        assert line in double.log


def test_oom_at_startup_never_listens() -> None:
    with pytest.raises(DoubleFailedToStart) as failed:
        DoubleProcess([], {"DSV4_DOUBLE_OOM_AFTER": "0"}).start()
    assert "torch.OutOfMemoryError: CUDA out of memory" in failed.value.log
    with pytest.raises(DoubleFailedToStart) as pool:
        DoubleProcess(["--mem-fraction-static", "0.91"], {"DSV4_DOUBLE_OOM_KIND": "pool"}).start()
    assert (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.91"
    ) in pool.value.log
    assert all(line in pool.value.log for line in OOM_LINES)
