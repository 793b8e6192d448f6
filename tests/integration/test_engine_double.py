"""The engine test double as a process: the operator's rendered argv/env start it, and it
serves SGLang-like endpoints (chat with DSML tool calls, /health, /metrics) with faults as
seeded. Its configuration and corruption curve, in process: tests/unit/test_engine_double.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4_devcluster.process import free_port
from dsv4_engine_double import outputs, shapes
from dsv4_engine_double.config import HICACHE_RACE, LOAD_HEADER, parse_config
from dsv4_engine_double.examples import (
    BF16_HICACHE,
    ROLE,
    Doc,
    conversation,
    corrupted,
    rendered,
)
from dsv4_engine_double.process import DoubleFailedToStart, DoubleProcess
from dsv4_engine_double.server import answer, conversation_rng
from dsv4_operator.canary.scenario import CANARY_TOOLS
from dsv4_operator.leak.classifier import classify_response
from dsv4_operator.leak.sse import assemble_stream
from dsv4_operator.leak.verdict import VerdictKind

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
    assert classify_response(body, tools=CANARY_TOOLS, must_call=True).kind is VerdictKind.OK


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
    assert classify_response(assembled, tools=CANARY_TOOLS, must_call=True).kind is VerdictKind.OK


def test_plain_answers_and_bad_requests(bf16_hicache: DoubleProcess) -> None:
    prose = chat(bf16_hicache.url, USER, tool_choice="none").json()["choices"][0]
    assert prose["finish_reason"] == "stop" and prose["message"]["tool_calls"] is None
    assert prose["message"]["content"]
    bad = httpx.post(f"{bf16_hicache.url}/v1/chat/completions", content=b"{", timeout=10)
    assert bad.status_code == 400 and bad.json()["object"] == "error"


def _leakyconversation() -> Doc:
    """The first canary-like conversation the fixture's config corrupts at load 60."""
    config = parse_config(*rendered(BF16_HICACHE))
    assert config.faults == (HICACHE_RACE,), config.faults
    # p = 4.55% per response at 60: the first hit is a handful of conversations in (and the
    # same one every time); 1000 bounds the search should the curve ever drop to 0.
    return next(b for b in map(conversation, range(1000)) if corrupted(config, b, 60))


def test_the_declared_load_header_decides_not_the_overlap(bf16_hicache: DoubleProcess) -> None:
    body = _leakyconversation()
    url = f"{bf16_hicache.url}/v1/chat/completions"

    def post(load: int | None) -> httpx.Response:
        headers = {LOAD_HEADER: str(load)} if load is not None else {}
        return httpx.post(url, json=body, headers=headers, timeout=10)

    def kind(reply: httpx.Response) -> VerdictKind:
        return classify_response(reply.json(), tools=CANARY_TOOLS, must_call=True).kind

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
    info = httpx.get(f"{url}/server_info").json()
    assert info["engine_double"] is True
    # The deprecated path still answers, as both releases' do (with a warning in the log).
    assert httpx.get(f"{url}/get_server_info").json()["tp_size"] == info["tp_size"]
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


def test_the_port_stays_closed_while_the_weights_load() -> None:
    """As SGLang's launch_server: no HTTP server until every scheduler has loaded."""
    port = free_port()
    args = ["--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port)]
    double = DoubleProcess(args, {"DSV4_DOUBLE_LOADING_S": "3600"}, bind=False)
    with double.start(loading=True):
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert "Uvicorn running" not in double.log


def test_a_group_worker_serves_the_health_checks_and_metrics_only() -> None:
    """`--node-rank 1`: a node > 0 of a multi-node group, which runs sglang's health-only
    server (launch_dummy_health_check_server): no API, no /server_info."""
    args = ["--served-model-name", "m", "--enable-metrics", "--node-rank", "1"]
    with DoubleProcess(args, {"DSV4_DOUBLE_STARTUP_S": "3600"}) as double:
        for path in ("/health", "/health_generate", "/ping", "/metrics"):
            assert httpx.get(f"{double.url}{path}").status_code == 200, path
        for path in ("/server_info", "/v1/models"):
            assert httpx.get(f"{double.url}{path}").status_code == 404, path
        assert chat(double.url, USER).status_code == 404


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


# --- the release it runs as: tool-call drops, KV checksum, server info -------------------------

NEW_RELEASE = {
    **BF16_HICACHE,
    "engine.sglangVersion": "0.5.23",
    "engine.capabilities": ["bf16IndexK", "poolSizingFix", "toolCallDropCounter"],
}
DROP_COUNTERS = ("sglang:dsv4_tool_call_responses_total", "sglang:dsv4_tool_call_drops_total")


def _launch(changes: dict[str, Any], **env: str) -> tuple[DoubleProcess, Any]:
    """A double started from the example's rendered StatefulSet with `changes`, and its config."""
    args, rendered_env = rendered(changes)
    full = {**rendered_env, "DSV4_DOUBLE_LATENCY_MS": "5", "DSV4_DOUBLE_LOAD": "60", **env}
    return DoubleProcess(args, full), parse_config(args, full)


def _drop_samples(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {
        sample.name + (f"[{sample.labels['reason']}]" if "reason" in sample.labels else ""): (
            sample.value
        )
        for family in text_string_to_metric_families(text)
        if family.name in {n.removesuffix("_total") for n in DROP_COUNTERS}
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def _by_output(config: Any, count: int = 1500) -> dict[outputs.Generated | None, Doc]:
    """One conversation per model output the double, so configured, generates at load 60
    (None: an uncorrupted one)."""
    found: dict[outputs.Generated | None, Doc] = {}
    for body in map(conversation, range(count)):
        drawn = answer(config, body, conversation_rng(config.seed, body), 60, 10).output
        found.setdefault(drawn.kind if drawn else None, body)
    return found


def test_0_5_23_drops_what_recipe_cannot_read_silently_logs_and_counts_it() -> None:
    process, config = _launch(NEW_RELEASE, DSV4_DOUBLE_SILENT_DROP_SHARE="1")
    assert config.sglang_version == "0.5.23" and config.counts_tool_call_drops
    found = _by_output(config)
    drops = {kind: found[kind] for kind in outputs.SILENT_DROPS}  # KeyError: never generated
    with process as double:
        before = _drop_samples(double.url)
        assert before == {"sglang:dsv4_tool_call_responses_total": 0.0} | {
            f"sglang:dsv4_tool_call_drops_total[{r}]": 0.0
            for r in ("unclosed", "malformed", "unterminated_section", "exception")
        }
        for kind, body in drops.items():
            reply = httpx.post(f"{double.url}/v1/chat/completions", json=body, timeout=10)
            assert reply.status_code == 200, kind
            choice = reply.json()["choices"][0]
            assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] is None
            assert choice["message"]["content"] in shapes.PREAMBLES  # the prose before the DSML
            tap = classify_response(reply.json(), tools=CANARY_TOOLS, must_call=False)
            assert tap.kind is VerdictKind.OK  # nothing to see on tool_choice auto traffic
        clean = httpx.post(f"{double.url}/v1/chat/completions", json=found[None], timeout=10)
        assert clean.json()["choices"][0]["finish_reason"] == "tool_calls"
        streamed = httpx.post(
            f"{double.url}/v1/chat/completions",
            json={**drops[outputs.Generated.NAMELESS_SECTION], "stream": True},
            timeout=10,
        )
        assembled = assemble_stream(streamed.text)["choices"][0]
        assert assembled["finish_reason"] == "stop"
        assert not assembled["message"].get("tool_calls")
        plain = httpx.post(
            f"{double.url}/v1/chat/completions",
            json={**found[None], "tool_choice": "none"},
            timeout=10,
        )
        assert plain.status_code == 200
        after = _drop_samples(double.url)
    # every response that offered tools, dropped or not, streamed or not; not tool_choice none
    assert after["sglang:dsv4_tool_call_responses_total"] == len(drops) + 2
    assert after["sglang:dsv4_tool_call_drops_total[unclosed]"] == 1
    assert after["sglang:dsv4_tool_call_drops_total[malformed]"] == 2  # and the streamed one
    assert after["sglang:dsv4_tool_call_drops_total[unterminated_section]"] == 1
    assert after["sglang:dsv4_tool_call_drops_total[exception]"] == 0
    log = double.log  # the patch's lines: recipe itself logs none
    assert log.count("WARNING Dropping unclosed DeepSeek invoke") == 1
    assert log.count("Dropping malformed DeepSeek invoke: 0 call(s) parsed from 1 invoke(s)") == 2
    assert log.count("WARNING Dropping unterminated DeepSeek tool-call section") == 1
    assert "Tool call marker present" not in log  # serving_chat's text path does not run


def test_0_5_23_returns_a_cut_off_call_with_its_broken_arguments() -> None:
    process, config = _launch(NEW_RELEASE)
    cut = _by_output(config)[outputs.Generated.CUT_IN_VALUE]
    with process as double:
        reply = httpx.post(f"{double.url}/v1/chat/completions", json=cut, timeout=10).json()
        after = _drop_samples(double.url)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"]
    (call,) = choice["message"]["tool_calls"]
    assert not call["function"]["arguments"].endswith("}")  # recipe stopped where the model did
    verdict = classify_response(reply, tools=CANARY_TOOLS, must_call=False)
    assert verdict.kind is VerdictKind.MALFORMED_CALL  # visible, to the tap too
    assert after["sglang:dsv4_tool_call_responses_total"] == 1
    assert "Dropping" not in double.log  # nothing was dropped, nothing is counted


def test_0_5_16_leaks_the_markup_into_content() -> None:
    changes = {**BF16_HICACHE, "engine.capabilities": ["bf16IndexK", "toolCallDropCounter"]}
    process, config = _launch(changes)
    assert config.sglang_version == "0.5.16" and not config.parses_with_recipe
    found = _by_output(config)
    leak = found[outputs.Generated.BROKEN_JSON_BODY]
    unterminated = found[outputs.Generated.UNCLOSED_SECTION]
    with process as double:
        reply = httpx.post(f"{double.url}/v1/chat/completions", json=leak, timeout=10).json()
        dropped = httpx.post(f"{double.url}/v1/chat/completions", json=unterminated, timeout=10)
        after = _drop_samples(double.url)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["tool_calls"] is None
    assert "<｜DSML｜tool_calls>" in choice["message"]["content"]
    verdict = classify_response(reply, tools=CANARY_TOOLS, must_call=True)
    assert verdict.kind is VerdictKind.LEAKED_MARKUP
    assert "ERROR Error in detect_and_parse: Expecting property name" in double.log
    # a section that never closes: dropped silently, the prose before it only
    silent = dropped.json()["choices"][0]
    assert silent["finish_reason"] == "stop" and silent["message"]["tool_calls"] is None
    assert silent["message"]["content"] in shapes.PREAMBLES
    # 0.5.16's patched parser counts the exception path that returned the markup, and the drop
    assert after["sglang:dsv4_tool_call_responses_total"] == 2
    assert after["sglang:dsv4_tool_call_drops_total[exception]"] == 1
    assert after["sglang:dsv4_tool_call_drops_total[unterminated_section]"] == 1
    assert double.log.count("WARNING Dropping unterminated DeepSeek tool-call section") == 1


def test_kv_checksum_mismatches_are_500_and_counted() -> None:
    args, env = rendered(NEW_RELEASE)
    args = [*args, "--disaggregation-enable-kv-checksum"]
    env = {**env, "DSV4_DOUBLE_LATENCY_MS": "5", "DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB": "0.5"}
    bodies = [conversation(i) for i in range(12)]
    with DoubleProcess(args, env) as double:
        url = f"{double.url}/v1/chat/completions"
        first = [httpx.post(url, json=b, timeout=10).status_code for b in bodies]
        again = [httpx.post(url, json=b, timeout=10).status_code for b in bodies]
        samples = _samples(double.url)
        failed = httpx.post(url, json=bodies[first.index(500)], timeout=10).json()
    assert first == again  # drawn from the seed and the conversation
    assert set(first) == {200, 500}
    assert failed["message"] == "KV checksum mismatch" and failed["code"] == 500
    assert samples["sglang:num_transfer_failed_reqs_total"] == 2 * first.count(500)
    assert double.log.count("KV checksum mismatch req=") == 2 * first.count(500) + 1
    # 0.5.16 has no --disaggregation-enable-kv-checksum: nothing is checked, nothing fails
    old_args, old_env = rendered(BF16_HICACHE)
    old_env = {
        **old_env,
        "DSV4_DOUBLE_LATENCY_MS": "5",
        "DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB": "1",
    }
    with DoubleProcess([*old_args, "--disaggregation-enable-kv-checksum"], old_env) as old:
        assert (
            httpx.post(f"{old.url}/v1/chat/completions", json=bodies[0], timeout=10).status_code
            == 200
        )


def test_server_info_reports_the_release_and_its_pool() -> None:
    args, env = rendered(NEW_RELEASE)
    planned = parse_config(args, env).max_total_tokens
    env = {**env, "DSV4_DOUBLE_REPORTED_MAX_TOTAL_TOKENS": "4000000"}
    with DoubleProcess(args, env) as double:
        info = httpx.get(f"{double.url}/server_info").json()
        samples = _samples(double.url)
    assert info["version"] == "0.5.23" and info["engine_double"] is True
    assert info["max_total_tokens"] == planned and planned != 4000000  # the plan's flag
    assert info["max_total_num_tokens"] == 4000000  # what the engine says it has
    assert samples["sglang:max_total_num_tokens"] == 4000000
    assert "sglang=0.5.23" in double.log


def test_bootstrap_handshake_failures_are_500_and_counted_on_decode_only() -> None:
    args, env = rendered(NEW_RELEASE, role="decode")
    env = {**env, "DSV4_DOUBLE_LATENCY_MS": "5", "DSV4_DOUBLE_BOOTSTRAP_FAILURE_PROB": "0.5"}
    bodies = [conversation(i) for i in range(12)]
    with DoubleProcess(args, env) as double:
        url = f"{double.url}/v1/chat/completions"
        first = [httpx.post(url, json=b, timeout=10).status_code for b in bodies]
        again = [httpx.post(url, json=b, timeout=10).status_code for b in bodies]
        samples = _samples(double.url)
    assert first == again  # drawn from the seed and the conversation
    assert set(first) == {200, 500}
    assert samples["sglang:num_bootstrap_failed_reqs_total"] == 2 * first.count(500)
    assert double.log.count("Decode handshake failed for request rank=0") == 2 * first.count(500)
    # A prefill engine has no decode bootstrap queue: nothing fails there.
    prefill, prefill_env = rendered(NEW_RELEASE)  # prefill's command
    with DoubleProcess(prefill, {**prefill_env, **env}) as double:
        url = f"{double.url}/v1/chat/completions"
        assert {httpx.post(url, json=b, timeout=10).status_code for b in bodies} == {200}
