"""The engine double's configuration: sglang argv + env in, active faults and corruption curve out.

Argv: the operator's engine command line after the entrypoint (`--model-path`,
`--served-model-name`, `--host`, `--port`, `--tp-size`, `--disaggregation-mode`, `--kv-cache-dtype`,
`--max-running-requests`, `--cuda-graph-max-bs`, `--context-length`, `--max-total-tokens`,
`--tool-call-parser`, `--reasoning-parser`, `--enable-metrics`, `--disable-overlap-schedule`,
`--enable-hierarchical-cache`, `--hicache-*`, `--enable-deepseek-v4-fp4-indexer`,
`--disaggregation-enable-kv-checksum`, `--node-rank`, ...). Unknown flags are kept in
`unknown_args` and echoed by `/server_info`. With `--node-rank` 1 or more the double is a
multi-node group's worker, as SGLang runs one: no API, only the health-only server
(`launch_dummy_health_check_server`): `/health`, `/health_generate` and `/ping` answer 200,
`/metrics` with `--enable-metrics`, anything else 404.

Engine env (as rendered by the operator):
- `SGLANG_DSV4_BF16_INDEX_K=1`: bf16 index-K, honoured only when the image has `bf16IndexK`
  (as the patched fork: upstream ignores the variable).
- `SGLANG_OPT_USE_MULTI_STREAM_OVERLAP`: unset means on (upstream's CUDA default).

Double-only knobs:
- `DSV4_DOUBLE_CAPABILITIES`: comma list of the image's capabilities (`bf16IndexK`,
  `indexKHiCacheGate`, `poolSizingFix`, `multiStreamIndexKFix`, `toolCallDropCounter`). Unset
  means `bf16IndexK` (the incident's patched fork without any fix); set it to the spec's
  `engine.capabilities` (the image's `dsv4.io/capabilities` label).
- `DSV4_DOUBLE_SGLANG_VERSION` (default `0.5.16`): the SGLang release the double runs as (the
  image's `dsv4.io/sglang-version` label, `spec.engine.sglangVersion`; the operator writes it on
  each engine StatefulSet as the annotation `dsv4.io/sglang-version`, which
  `process.launch_from_statefulset` turns into this variable): 0.5.16 or 0.5.23, the releases
  whose parsers the double models (any other is refused). It decides what a corrupted model
  output becomes (parsers.py): 0.5.16's DeepSeek detector leaks the DSML of a section it fails
  on into `content` (the incident) and drops a section that never closes; 0.5.23 parses
  DeepSeek-V4 chat with deepseek-recipe, which returns what it can read as calls (broken
  arguments at worst) and drops only what it cannot. It is also `/server_info`'s `version`,
  and `--disaggregation-enable-kv-checksum` exists from 0.5.21 on only.
- `DSV4_DOUBLE_SILENT_DROP_SHARE` (default 0): the share of corrupted tool calls whose output is
  one deepseek-recipe reads no call from (outputs.SILENT_DROPS, a third each: a tool-calls section
  that ends before any invoke, a closed section whose invoke has no name, an invoke without a
  name and no section); the rest follow the fault's own outputs. On 0.5.23 each is a silent
  drop: HTTP 200, finish_reason "stop", no tool_calls, the prose before the DSML as `content`,
  counted (with toolCallDropCounter) under `unterminated_section`, `malformed` or `unclosed`.
  1 makes every corruption a silent drop there: at the HiCache plateau 4.55% of tool calls on
  `tool_choice: auto` traffic. 0.5.16 drops the two section shapes as silently and returns the
  nameless invoke as `content`.
- `DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB` (default 0; upstream's test hook is
  `SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB`): with `--disaggregation-enable-kv-checksum` on a
  release that has it, this share of chat requests (a draw of the seed and the conversation,
  like the others) fails the transfer checksum: HTTP 500 `KV checksum mismatch`, counted in
  `sglang:num_transfer_failed_reqs_total`.
- `DSV4_DOUBLE_BOOTSTRAP_FAILURE_PROB` (default 0; upstream's test hook is
  `SGLANG_TEST_DISAGG_FAILURE_PROB`, which fails KV polls at random): on a decode engine, this
  share of chat requests (a draw of the seed and the conversation) fails the PD bootstrap
  handshake as `disaggregation/decode.py` handles `KVPoll.Failed` in the bootstrap queue: the
  error log line `Decode handshake failed for request ...`, HTTP 500, counted in
  `sglang:num_bootstrap_failed_reqs_total`.
- `DSV4_DOUBLE_REPORTED_MAX_TOTAL_TOKENS`: the KV pool size the engine reports
  (`/server_info`'s `max_total_num_tokens`, `sglang:max_total_num_tokens`) instead of
  `--max-total-tokens`: an engine that disagrees with its plan.
- `DSV4_DOUBLE_LEAK_WHEN` (default unset): a comma list of conditions that must all hold for the
  double to leak (the `configured-leak` fault), whatever the index-K and the capabilities: a
  culprit made of any settings, for the bisection tests. A condition is `--flag` (the flag is in
  the argv, as `--flag` or `--flag=...`), `--flag=value` (the flag has that value, as
  `--flag value` or `--flag=value`), `NAME=value` (the env variable has that value) or `NAME`
  (the env variable is set and not empty). `--enable-hierarchical-cache,SGLANG_DSV4_BF16_INDEX_K=1`
  is a two-setting interaction: either alone is clean. A condition that is empty or starts
  with `-` but not `--` is refused.
- `DSV4_DOUBLE_LEAK_RATE` (default 0.2): the per-response corruption probability of the
  `configured-leak` fault and of the `early-noise` fault below, at any load.
- `DSV4_DOUBLE_LEAK_FIRST=N` (default 0): the `early-noise` fault: the first N chat requests this
  process serves are corrupted with probability `DSV4_DOUBLE_LEAK_RATE` (a draw of the seed and
  the conversation, like the others), whatever the settings; from request N+1 on it is gone. A
  leak that does not reproduce ("flaky noise"), counted, not timed, so tests stay deterministic.
- `DSV4_DOUBLE_LOAD=N` (default 1): the declared load, i.e. the number of chat requests the
  engine is to be taken as running (all clients together) while it serves each request. The
  corruption curve below reads this number; it never reads the clock or the requests actually
  in flight, so verdicts follow the inputs only. A request may declare its own load with the
  header `X-DSV4-Double-Load: N` (it wins over the env; a bad value is answered with 400).
  `DSV4_DOUBLE_LOAD=observed` opts in to the old behaviour, the peak number of chat requests
  running while the request was served: it follows machine load and timing, so it is
  NON-DETERMINISTIC and meant only for hand-run benchmarks (`dsv4 probe` against a hand-run
  double); no test uses it. Either way the load is capped at `--max-running-requests`.
- `DSV4_DOUBLE_SEED` (default 0): seeds every draw. A draw is a hash of the seed and the
  conversation (messages, tools, tool_choice), so the same conversation at the same declared
  load always gets the same answer and the same corruption verdict, whatever the timing. The
  corruption draw is one uniform number compared with the curve, so a conversation corrupted
  at some load is corrupted at every higher load too.
- `DSV4_DOUBLE_LATENCY_MS` (default 200): simulated time per chat request (x0.75..1.25,
  drawn from the conversation). It only shapes latency metrics and timeouts; in the default
  declared-load mode it has no effect on answers.
- `DSV4_DOUBLE_LOADING_S` (default 0): the port stays closed this long after start, as
  SGLang's HTTP server starts only once every scheduler has loaded its weights
  (docs/engine-notes.md, "Start-up"): a connection is refused until then.
- `DSV4_DOUBLE_STARTUP_S` (default 0): once the port is open, `/health*` answer 503 for this
  long (SGLang's `ServerStatus.Starting`, until its warm-up request has run).
- `DSV4_DOUBLE_OOM_AFTER=N`: serve N chat requests, then crash with a CUDA OOM on the next
  (`0` crashes during startup, as in CUDA-graph capture).
- `DSV4_DOUBLE_OOM_KIND`: `cuda` (default: `torch.OutOfMemoryError: CUDA out of memory. Tried
  to allocate ...`) or `pool` (`RuntimeError: Not enough memory. Please try to increase
  --mem-fraction-static ...` at startup; implies `OOM_AFTER=0`). Either way the log then has
  `Scheduler hit an exception` and `Received sigquit from a child process...`
  (docs/engine-notes.md#failure-logs-and-metrics) and the process kills itself with SIGKILL
  (exit 137 in a container, -9 from `subprocess`).

Corruption curve (per response; `c` = the load, declared as above, capped at
`--max-running-requests`):
- HiCache index-K race (bf16 + HiCache, no `indexKHiCacheGate`):
  `p = 0.0455 * smoothstep((c - 4) / 36)`: 0 up to 4, full from 40. A 4-round session then
  sees a corrupted response with probability `1 - (1 - p)^4`: 0 at c=1, 2.3% at 12, 10% at 24,
  15% at 32, 17% from 40 on (the incident: 0% at C=1, 12-18% at C>=60). The plateau starts below
  60 because a 60-session canary does not keep all 60 in flight all the time.
- Multi-stream aliasing (bf16 + multi-stream overlap, no `multiStreamIndexKFix`):
  `p = 0.032 * clamp((c - 8) / 72)`: 0 up to 8, linear to 3.2% at 80 (12% of 4-round
  sessions, the incident's "bf16 at rounds=4, HiCache off" figure), 2.3% (9%) at 60.
- Both active: `1 - (1 - p1)(1 - p2)`. fp8 / fp4 index-K, or the fixes: 0.
- `configured-leak` and `early-noise` (the knobs above): `DSV4_DOUBLE_LEAK_RATE` at any load,
  compounded with the others the same way.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

HICACHE_RACE = "hicache-index-k-race"
MULTI_STREAM_ALIASING = "multi-stream-aliasing"
CONFIGURED_LEAK = "configured-leak"
EARLY_NOISE = "early-noise"
DEFAULT_LEAK_RATE = 0.2

HICACHE_P_MAX, HICACHE_LOW, HICACHE_HIGH = 0.0455, 4.0, 40.0
MULTI_STREAM_P_MAX, MULTI_STREAM_LOW, MULTI_STREAM_HIGH = 0.032, 8.0, 80.0
DEFAULT_CAPABILITIES = "bf16IndexK"
DEFAULT_SGLANG_VERSION = "0.5.16"
# The releases whose tool-call parsing the double models (parsers.py) ...
MODELLED_RELEASES = ((0, 5, 16), (0, 5, 23))
# ... the one that parses DeepSeek-V4 chat with deepseek-recipe, and the first with
# --disaggregation-enable-kv-checksum.
RECIPE_SINCE = (0, 5, 23)
KV_CHECKSUM_SINCE = (0, 5, 21)
DEFAULT_MAX_TOTAL_TOKENS = 1_000_000
LOAD_ENV = "DSV4_DOUBLE_LOAD"
LOAD_HEADER = "X-DSV4-Double-Load"
OBSERVED = "observed"


@dataclass(frozen=True)
class DoubleConfig:
    """Resolved server args (what `/server_info` echoes) plus the double's knobs."""

    model_path: str = "deepseek-ai/DeepSeek-V4-Flash"
    served_model_name: str = ""
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = 8998
    kv_cache_dtype: str = "auto"
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    cuda_graph_max_bs: int | None = None
    context_length: int | None = None
    max_total_tokens: int | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_metrics: bool = False
    disable_overlap_schedule: bool = False
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: int = 0
    hicache_write_policy: str = "write_through"
    enable_deepseek_v4_fp4_indexer: bool = False
    disaggregation_enable_kv_checksum: bool = False
    node_rank: int = 0  # >= 1: a multi-node group's worker
    unknown_args: tuple[str, ...] = ()
    # env
    bf16_index_k_requested: bool = False
    multi_stream_overlap: bool = True
    capabilities: frozenset[str] = field(default_factory=frozenset)
    seed: int = 0
    load: int = 1  # declared load (DSV4_DOUBLE_LOAD)
    observe_load: bool = False  # DSV4_DOUBLE_LOAD=observed: non-deterministic, opt-in only
    latency_s: float = 0.2
    loading_s: float = 0.0
    startup_s: float = 0.0
    oom_after: int | None = None
    oom_kind: str = "cuda"
    sglang_version: str = DEFAULT_SGLANG_VERSION
    silent_drop_share: float = 0.0
    kv_checksum_mismatch_prob: float = 0.0
    bootstrap_failure_prob: float = 0.0
    reported_max_total_tokens: int | None = None
    leak_when: tuple[str, ...] = ()  # DSV4_DOUBLE_LEAK_WHEN, as given
    leak_when_met: bool = False  # every condition of leak_when holds for this argv and env
    leak_rate: float = DEFAULT_LEAK_RATE
    leak_first: int = 0  # DSV4_DOUBLE_LEAK_FIRST

    @property
    def parses_with_recipe(self) -> bool:
        """Whether DeepSeek-V4 chat output is parsed by deepseek-recipe (else: 0.5.16's
        DeepSeekV4Detector)."""
        return release_tuple(self.sglang_version) >= RECIPE_SINCE

    @property
    def kv_checksum(self) -> bool:
        """Whether transfers are checksummed: the flag, on a release that has it."""
        return (
            self.disaggregation_enable_kv_checksum
            and release_tuple(self.sglang_version) >= KV_CHECKSUM_SINCE
        )

    @property
    def counts_tool_call_drops(self) -> bool:
        """The image's toolCallDropCounter patch, with a DSML tool-call parser configured."""
        return "toolCallDropCounter" in self.capabilities and self.tool_call_parser in (
            "deepseekv32",
            "deepseekv4",
            "deepseekv41",
        )

    @property
    def reported_max_total(self) -> int:
        """The KV pool size the engine reports (its plan's, unless the knob overrides it)."""
        if self.reported_max_total_tokens is not None:
            return self.reported_max_total_tokens
        return self.max_total_tokens or DEFAULT_MAX_TOTAL_TOKENS

    @property
    def name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def index_k_dtype(self) -> str:
        if self.enable_deepseek_v4_fp4_indexer:
            return "fp4"
        if self.bf16_index_k_requested and "bf16IndexK" in self.capabilities:
            return "bf16"
        return "fp8"

    @property
    def faults(self) -> tuple[str, ...]:
        """The incident's faults this configuration has."""
        found: list[str] = []
        if self.index_k_dtype == "bf16":
            if self.enable_hierarchical_cache and "indexKHiCacheGate" not in self.capabilities:
                found.append(HICACHE_RACE)
            if self.multi_stream_overlap and "multiStreamIndexKFix" not in self.capabilities:
                found.append(MULTI_STREAM_ALIASING)
        if self.leak_when_met:
            found.append(CONFIGURED_LEAK)
        return tuple(found)

    def fault_probabilities(self, load: float, request_number: int = 0) -> dict[str, float]:
        """Each active fault's per-response corruption probability at (declared) `load`, for
        this process's `request_number`-th chat request (1-based; 0: past any early noise)."""
        found = {f: fault_probability(f, load, self.leak_rate) for f in self.faults}
        if 0 < request_number <= self.leak_first:
            found[EARLY_NOISE] = self.leak_rate
        return found

    def capped(self, load: int) -> int:
        """`load` capped at `--max-running-requests` (what the engine can run at once)."""
        cap = self.max_running_requests
        return max(1, min(load, cap) if cap else load)

    def server_info(self) -> dict[str, Any]:
        info = asdict(self)
        info["capabilities"] = sorted(self.capabilities)
        info["unknown_args"] = list(self.unknown_args)
        info["index_k_dtype"] = self.index_k_dtype
        info["faults"] = list(self.faults)
        info["leak_when"] = list(self.leak_when)
        info["max_total_num_tokens"] = self.reported_max_total
        info["version"] = self.sglang_version  # as SGLang's: its __version__
        return info


def release_tuple(version: str) -> tuple[int, ...]:
    """`0.5.23` -> (0, 5, 23); a `.postN` suffix is ignored."""
    try:
        return tuple(int(part) for part in version.split(".")[:3])
    except ValueError as error:
        raise ValueError(f"not an SGLang release: {version!r}") from error


def _smoothstep(x: float) -> float:
    t = min(1.0, max(0.0, x))
    return t * t * (3 - 2 * t)


def fault_probability(fault: str, load: float, leak_rate: float = DEFAULT_LEAK_RATE) -> float:
    """Per-response corruption probability of one fault at (declared) `load` (`leak_rate`: the
    knobs' faults, which do not depend on the load)."""
    if fault in (CONFIGURED_LEAK, EARLY_NOISE):
        return leak_rate
    if fault == HICACHE_RACE:
        return HICACHE_P_MAX * _smoothstep((load - HICACHE_LOW) / (HICACHE_HIGH - HICACHE_LOW))
    if fault == MULTI_STREAM_ALIASING:
        share = (load - MULTI_STREAM_LOW) / (MULTI_STREAM_HIGH - MULTI_STREAM_LOW)
        return MULTI_STREAM_P_MAX * min(1.0, max(0.0, share))
    raise ValueError(f"unknown fault {fault!r}")


def corruption_probability(config: DoubleConfig, load: float, request_number: int = 0) -> float:
    """Per-response probability that `config` corrupts a response at (declared) `load` (of its
    `request_number`-th chat request: the early noise; 0 means past it)."""
    clean = math.prod(1 - p for p in config.fault_probabilities(load, request_number).values())
    return 1 - clean


def session_corruption_probability(config: DoubleConfig, load: float, rounds: int) -> float:
    """Probability that a session of `rounds` responses sees at least one corruption."""
    return 1 - (1 - corruption_probability(config, load)) ** rounds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dsv4_engine_double",
        description="Engine test double standing in for sglang.launch_server (no GPU here).",
        allow_abbrev=False,
    )
    p.add_argument("--model-path", "--model", dest="model_path", default=DoubleConfig.model_path)
    p.add_argument("--served-model-name", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int, default=1
    )
    p.add_argument("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    # Decode's own flag, which the operator renders for every supported release (with
    # --cuda-graph-max-bs as its alias in 0.5.16: engine/data/releases.yaml).
    p.add_argument(
        "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs", type=int
    )
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--enable-hierarchical-cache", action="store_true")
    p.add_argument("--hicache-ratio", type=float, default=2.0)
    p.add_argument("--hicache-size", type=int, default=0)
    p.add_argument("--hicache-write-policy", default="write_through")
    p.add_argument("--enable-deepseek-v4-fp4-indexer", action="store_true")
    p.add_argument("--disaggregation-enable-kv-checksum", action="store_true")
    p.add_argument("--node-rank", type=int, default=0)
    return p


def _share(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise SystemExit(f"{name} must be a number in [0, 1], got {raw!r}")
    return value


def parse_load(raw: str, source: str, *, allow_observed: bool) -> int | None:
    """A declared load (an integer >= 1); None for `observed` where that is allowed."""
    value = raw.strip()
    if allow_observed and value.lower() == OBSERVED:
        return None
    try:
        load = int(value)
    except ValueError:
        load = 0
    if load < 1:
        allowed = f"an integer >= 1 or {OBSERVED!r}" if allow_observed else "an integer >= 1"
        raise ValueError(f"{source} must be {allowed}, got {raw!r}")
    return load


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _leak_conditions(raw: str) -> tuple[str, ...]:
    conditions = tuple(c.strip() for c in raw.split(","))
    if raw.strip() == "":
        return ()
    for condition in conditions:
        if not condition or (condition.startswith("-") and not condition.startswith("--")):
            raise SystemExit(
                f"DSV4_DOUBLE_LEAK_WHEN: {condition!r} is not a condition: name `--flag`, "
                "`--flag=value`, `ENV_NAME=value` or `ENV_NAME`, comma-separated"
            )
    return conditions


def _argv_value(argv: Sequence[str], flag: str) -> str | None:
    """The value `flag` has in `argv` (the last one, as argparse), "" for a bare flag, None
    when absent."""
    found: str | None = None
    for index, token in enumerate(argv):
        if token == flag:
            following = argv[index + 1] if index + 1 < len(argv) else ""
            found = "" if following.startswith("--") else following
        elif token.startswith(flag + "="):
            found = token[len(flag) + 1 :]
    return found


def leak_condition_holds(condition: str, argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether one DSV4_DOUBLE_LEAK_WHEN condition holds for this argv and env."""
    name, has_value, value = condition.partition("=")
    if name.startswith("--"):
        given = _argv_value(argv, name)
        return given is not None and (not has_value or given == value)
    actual = env.get(name)
    return actual == value if has_value else bool(actual)


def parse_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> DoubleConfig:
    """Resolve argv (sglang flags; unknown ones tolerated) and env into a DoubleConfig."""
    env = os.environ if env is None else env
    args, unknown = _parser().parse_known_args(list(argv))
    caps_raw = env.get("DSV4_DOUBLE_CAPABILITIES")
    caps_raw = DEFAULT_CAPABILITIES if caps_raw is None else caps_raw
    capabilities = frozenset(c.strip() for c in caps_raw.split(",") if c.strip())
    oom_raw = env.get("DSV4_DOUBLE_OOM_AFTER", "").strip()
    oom_kind = env.get("DSV4_DOUBLE_OOM_KIND", "cuda").strip() or "cuda"
    if oom_kind not in ("cuda", "pool"):
        raise SystemExit(f"DSV4_DOUBLE_OOM_KIND must be cuda or pool, got {oom_kind!r}")
    oom_after = int(oom_raw) if oom_raw else None
    if oom_kind == "pool":
        oom_after = 0
    try:
        load = parse_load(env.get(LOAD_ENV, "") or "1", LOAD_ENV, allow_observed=True)
        version = env.get("DSV4_DOUBLE_SGLANG_VERSION", "").strip() or DEFAULT_SGLANG_VERSION
        if release_tuple(version) not in MODELLED_RELEASES:
            modelled = ", ".join(".".join(map(str, r)) for r in MODELLED_RELEASES)
            raise ValueError(
                f"DSV4_DOUBLE_SGLANG_VERSION: the double models SGLang {modelled}, not {version!r}"
            )
    except ValueError as error:
        raise SystemExit(str(error)) from error
    reported = env.get("DSV4_DOUBLE_REPORTED_MAX_TOTAL_TOKENS", "").strip()
    leak_when = _leak_conditions(env.get("DSV4_DOUBLE_LEAK_WHEN", ""))
    leak_first_raw = env.get("DSV4_DOUBLE_LEAK_FIRST", "").strip() or "0"
    if not leak_first_raw.isdigit():
        raise SystemExit(f"DSV4_DOUBLE_LEAK_FIRST must be an integer >= 0, got {leak_first_raw!r}")
    return DoubleConfig(
        **{k: v for k, v in vars(args).items()},
        unknown_args=tuple(unknown),
        bf16_index_k_requested=_flag(env, "SGLANG_DSV4_BF16_INDEX_K", False),
        multi_stream_overlap=_flag(env, "SGLANG_OPT_USE_MULTI_STREAM_OVERLAP", True),
        capabilities=capabilities,
        seed=int(env.get("DSV4_DOUBLE_SEED", "0") or 0),
        load=load or 1,
        observe_load=load is None,
        latency_s=float(env.get("DSV4_DOUBLE_LATENCY_MS", "200") or 200) / 1000.0,
        loading_s=float(env.get("DSV4_DOUBLE_LOADING_S", "0") or 0),
        startup_s=float(env.get("DSV4_DOUBLE_STARTUP_S", "0") or 0),
        oom_after=oom_after,
        oom_kind=oom_kind,
        sglang_version=version,
        silent_drop_share=_share(env, "DSV4_DOUBLE_SILENT_DROP_SHARE", 0.0),
        kv_checksum_mismatch_prob=_share(env, "DSV4_DOUBLE_KV_CHECKSUM_MISMATCH_PROB", 0.0),
        bootstrap_failure_prob=_share(env, "DSV4_DOUBLE_BOOTSTRAP_FAILURE_PROB", 0.0),
        reported_max_total_tokens=int(reported) if reported else None,
        leak_when=leak_when,
        leak_when_met=bool(leak_when)
        and all(leak_condition_holds(c, list(argv), env) for c in leak_when),
        leak_rate=_share(env, "DSV4_DOUBLE_LEAK_RATE", DEFAULT_LEAK_RATE),
        leak_first=int(leak_first_raw),
    )
