"""Engine test double: a small stand-in for an SGLang DeepSeek-V4 engine. It is NOT SGLang.

Test support, never part of the operator: it lives in testsupport/ (the `dsv4-testsupport`
distribution) so that the tests, the benchmarks and the demo can all start it.
There is no GPU here, so tests run this OpenAI-compatible aiohttp server instead of
`python3 -m sglang.launch_server`. It accepts the same argv and env the operator renders for an
engine container (unknown flags are tolerated), answers tool-calling conversations the way a
DSML-parsing SGLang does (`tool_calls` with JSON arguments, `finish_reason: "tool_calls"`),
streams SSE, serves `/health`, `/health_generate`, `/v1/models`, `/server_info` and
`/metrics` with real `sglang:*` names, and reproduces the incident's faults:

- bf16 index-K + HiCache on an image without `indexKHiCacheGate` corrupts responses with a
  probability that grows with the load (0 at 1, about 17% of 4-round sessions at 60);
- bf16 index-K + `SGLANG_OPT_USE_MULTI_STREAM_OVERLAP` without `multiStreamIndexKFix` degrades
  linearly with load ("loses the plot");

The load is DECLARED, not measured: `DSV4_DOUBLE_LOAD=N` (default 1) or a request's
`X-DSV4-Double-Load: N` header. Each draw is a hash of `DSV4_DOUBLE_SEED` and the conversation,
so the same conversation at the same declared load always gets the same answer, on an idle
laptop or a saturated CI runner alike. (`DSV4_DOUBLE_LOAD=observed` measures overlap instead:
non-deterministic, for hand-run benchmarks only.)
- everything else (fp8, fp4, the gated/fixed images) never corrupts;
- `DSV4_DOUBLE_OOM_AFTER=N` crashes the process with SGLang's CUDA OOM log lines;
- a corrupted model output (outputs.py) is answered as the SGLang release the double runs as
  (`DSV4_DOUBLE_SGLANG_VERSION`, which `process.launch_from_statefulset` takes from the engine
  StatefulSet's `dsv4.io/sglang-version` annotation) parses it (parsers.py, checked against each
  release's wheel by tests/conformance/test_engine_double.py): 0.5.16's detector leaks the DSML
  into `content` or drops the call, 0.5.23's deepseek-recipe returns calls with broken arguments
  or drops what it cannot read (`DSV4_DOUBLE_SILENT_DROP_SHARE`), with the release's log lines
  and, on an image with `toolCallDropCounter`, `sglang:dsv4_tool_call_responses_total` and
  `sglang:dsv4_tool_call_drops_total{reason}` on `/metrics`;
- with `--disaggregation-enable-kv-checksum` (0.5.23), `DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB`
  of the chat requests fail the transfer checksum: HTTP 500, counted in
  `sglang:num_transfer_failed_reqs_total`; `/server_info` reports `version` and
  `max_total_num_tokens` (`DSV4_DOUBLE_REPORTED_MAX_TOTAL_TOKENS` makes it disagree with the plan);
- on decode, `DSV4_DOUBLE_BOOTSTRAP_FAILURE_PROB` of the chat requests fail the PD bootstrap
  handshake: HTTP 500, counted in `sglang:num_bootstrap_failed_reqs_total`.

Run:  python -m dsv4_engine_double --model-path M --served-model-name S --host 127.0.0.1
--port 0 [any other sglang flags]   (port 0 picks a free port; the log line
`Uvicorn running on http://HOST:PORT` says which). The knobs are documented in `config.py`.
"""

from dsv4_engine_double.config import DoubleConfig, corruption_probability, parse_config

__all__ = ["DoubleConfig", "corruption_probability", "parse_config"]
