"""The engine double's `/metrics`: real `sglang:*` names in a registry of the double's own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dsv4_engine_double.config import DoubleConfig

# SGLang's time_to_first_token buckets (0.1 ... 400 s), with finer ones below for the double.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60,
                80, 100, 200, 400)  # fmt: skip
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
DROP_REASONS = ("unclosed", "malformed", "unterminated_section", "exception")


class Metrics:
    """Real `sglang:*` names (docs/engine-notes.md#failure-logs-and-metrics) in a registry of
    this server's own."""

    def __init__(self, config: DoubleConfig) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        sched = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        self.sched = {
            "model_name": config.name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
        }
        self.model = {"model_name": config.name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, sched, registry=r)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.max_tokens = gauge("sglang:max_total_num_tokens", "Maximum total number of tokens.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.is_cuda_graph = gauge("sglang:is_cuda_graph", "Whether the batch used a CUDA graph.")
        self.retracted = Counter(
            "sglang:num_retracted_requests_total", "Retracted requests.", sched, registry=r
        )
        self.graph_passes = Counter(
            "sglang:cuda_graph_passes_total",
            "Decode passes by mode.",
            [*sched, "mode"],
            registry=r,
        )
        self.bootstrap_failed = Counter(
            "sglang:num_bootstrap_failed_reqs_total", "PD bootstrap failures.", sched, registry=r
        )
        self.transfer_failed = Counter(
            "sglang:num_transfer_failed_reqs_total", "PD KV transfer failures.", sched, registry=r
        )
        tok = ["model_name"]
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens_total", "Prefill tokens processed.", tok, registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total", "Generation tokens processed.", tok, registry=r
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens_total", "Prefix-cache hit tokens.", tok, registry=r
        )
        self.requests = Counter("sglang:num_requests_total", "Requests processed.", tok, registry=r)
        self.aborted = Counter(
            "sglang:num_aborted_requests_total", "Requests aborted.", tok, registry=r
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            tok,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of end-to-end request latency in seconds.",
            tok,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.evicted = self.load_back = None
        if config.enable_hierarchical_cache:
            self.evicted = Counter(
                "sglang:evicted_tokens_total", "HiCache evicted tokens.", tok, registry=r
            )
            self.load_back = Counter(
                "sglang:load_back_tokens_total", "HiCache loaded-back tokens.", tok, registry=r
            )
        # Touch every labelled child so the series exist before the first request.
        self.max_tokens.labels(**self.sched).set(config.reported_max_total)
        self.is_cuda_graph.labels(**self.sched).set(1)
        for counter in (self.retracted, self.bootstrap_failed, self.transfer_failed):
            counter.labels(**self.sched)
        for mode in ("decode_cuda_graph", "decode_none"):
            self.graph_passes.labels(**self.sched, mode=mode)
        for metric in (self.prompt_tokens, self.generation_tokens, self.cached_tokens):
            metric.labels(**self.model)
        for family in (self.requests, self.aborted, self.ttft, self.e2e):
            family.labels(**self.model)

        # toolCallDropCounter (images/engine/patches/*/0002): exported, at 0, from start-up.
        self.tool_call_responses = self.tool_call_drops = None
        if config.counts_tool_call_drops:
            self.tool_call_responses = Counter(
                "sglang:dsv4_tool_call_responses_total",
                "Responses the DeepSeek tool-call parser parsed while the request offered tools.",
                registry=r,
            )
            self.tool_call_drops = Counter(
                "sglang:dsv4_tool_call_drops_total",
                "Responses in which the DeepSeek tool-call parser dropped a tool call, under the "
                "first drop's reason.",
                ["reason"],
                registry=r,
            )
            for reason in DROP_REASONS:
                self.tool_call_drops.labels(reason=reason)

    def count_tool_call_response(self, drop_reason: str | None) -> None:
        """One response parsed while tools were offered (on an image that counts them)."""
        if self.tool_call_responses is None or self.tool_call_drops is None:
            return
        self.tool_call_responses.inc()
        if drop_reason is not None:
            self.tool_call_drops.labels(reason=drop_reason).inc()

    def observe_load(self, running: int, queued: int, used_tokens: int, max_total: int) -> None:
        self.running.labels(**self.sched).set(running)
        self.queued.labels(**self.sched).set(queued)
        self.used_tokens.labels(**self.sched).set(used_tokens)
        self.token_usage.labels(**self.sched).set(min(1.0, used_tokens / max_total))
