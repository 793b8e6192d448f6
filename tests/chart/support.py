"""Shared helpers of the chart, alert, dashboard and image tests: pinned tools, rendering, and
the RBAC rules the operator needs.

The tools come from tools/devtools.py (pinned versions, fetched into the cache on first use);
a tool that cannot be had fails the test, it never skips it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.support.series import operator_families, tap_families

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "dsv4-operator"
RULES_FILE = CHART / "files" / "dsv4.rules.yaml"
DASHBOARD_FILE = CHART / "files" / "dashboards" / "dsv4.json"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "promtool" / "dsv4.rules.test.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"

# The RBAC rules the operator needs, as measured (docs/install.md#rbac).
NAMESPACED_RULES = [
    {"apiGroups": ["dsv4.io"], "resources": ["dsv4deployments"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["dsv4.io"], "resources": ["dsv4deployments/status"], "verbs": ["patch"]},
    {
        "apiGroups": ["dsv4.io"],
        "resources": ["dsv4models"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {"apiGroups": ["dsv4.io"], "resources": ["dsv4models/status"], "verbs": ["patch"]},
    {
        "apiGroups": ["apps"],
        "resources": ["statefulsets", "deployments"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["apps"],
        "resources": ["controllerrevisions"],
        "verbs": ["list", "watch", "create", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["services"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {
        "apiGroups": [""],
        "resources": ["persistentvolumeclaims", "serviceaccounts"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    # The Hub token's Secret: get by name (metadata only), never list or watch.
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "create", "patch"]},
    # Multi-node roles: one LeaderWorkerSet per role, a child like the StatefulSets above.
    {
        "apiGroups": ["leaderworkerset.x-k8s.io"],
        "resources": ["leaderworkersets"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["monitoring.coreos.com"],
        "resources": ["servicemonitors"],
        "verbs": ["list", "watch", "create", "patch", "delete"],
    },
]
CRD_RULE = {
    "apiGroups": ["apiextensions.k8s.io"],
    "resources": ["customresourcedefinitions"],
    "verbs": ["list", "watch"],
}
NAMESPACE_RULE = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}


# The sample names the operator and the leak tap export, read from their own metric objects.
OPERATOR_METRICS = frozenset(operator_families()) | frozenset(tap_families())


def _words(text: str) -> list[str]:
    return text.split()


# SGLang's metrics: python/sglang/srt/metrics/collector.py (scheduler, PD, tokenizer and
# HiCache groups).
SGLANG_METRICS = frozenset(
    "sglang:" + name
    for name in _words(
        """
    num_running_reqs num_used_tokens token_usage swa_token_usage pending_prealloc_token_usage
    gen_throughput num_queue_reqs num_grammar_queue_reqs cache_hit_rate max_total_num_tokens
    decode_sum_seq_lens spec_accept_length spec_accept_rate num_retracted_reqs num_paused_reqs
    utilization engine_startup_time engine_load_weights_time new_token_ratio is_cuda_graph
    num_retracted_requests_total num_retracted_input_tokens_total
    num_retracted_output_tokens_total cuda_graph_passes_total realtime_tokens_total
    gpu_execution_seconds_total queue_time_seconds per_stage_req_latency_seconds
    num_prefill_prealloc_queue_reqs num_prefill_inflight_queue_reqs
    num_decode_prealloc_queue_reqs num_decode_transfer_queue_reqs
    num_bootstrap_failed_reqs_total num_transfer_failed_reqs_total kv_transfer_speed_gb_s
    kv_transfer_latency_ms kv_transfer_bootstrap_ms kv_transfer_alloc_ms kv_transfer_total_mb
    prompt_tokens_total generation_tokens_total cached_tokens_total num_requests_total
    num_so_requests_total num_aborted_requests_total time_to_first_token_seconds
    inter_token_latency_seconds e2e_request_latency_seconds num_retractions
    prompt_tokens_histogram generation_tokens_histogram evicted_tokens_total
    load_back_tokens_total eviction_duration_seconds load_back_duration_seconds
    prefetched_tokens_total backuped_tokens_total prefetch_pgs backup_pgs prefetch_bandwidth
    backup_bandwidth prefetch_occupied_ratio
    """
    )
)
# Prometheus' own series the rules and dashboard may use.
PROMETHEUS_METRICS = frozenset({"up"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def known_metric(name: str) -> bool:
    known = OPERATOR_METRICS | SGLANG_METRICS | PROMETHEUS_METRICS
    if name in known:
        return True
    return any(name.endswith(s) and name[: -len(s)] in known for s in HISTOGRAM_SUFFIXES)


# PromQL words that look like metric names: functions, aggregations, keywords.
_PROMQL_WORDS = frozenset(
    _words(
        """
    abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month day_of_week
    day_of_year days_in_month delta deriv exp floor histogram_count histogram_sum
    histogram_fraction histogram_quantile holt_winters hour idelta increase irate label_join
    label_replace ln log2 log10 minute month predict_linear rate resets round scalar sgn sort
    sort_desc sqrt time timestamp vector year avg_over_time min_over_time max_over_time
    sum_over_time count_over_time quantile_over_time stddev_over_time stdvar_over_time
    last_over_time present_over_time sum min max avg group stddev stdvar count count_values
    bottomk topk quantile by without on ignoring group_left group_right offset bool and or
    unless inf nan
    """
    )
)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (strings, matchers, ranges and label lists removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    names = set()
    for match in re.finditer(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)", text):
        word = match.group(1)
        rest = text[match.end() :].lstrip()
        if word in _PROMQL_WORDS or rest.startswith("("):
            continue
        if re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


@functools.cache
def devtools() -> ModuleType:
    spec = importlib.util.spec_from_file_location("devtools", REPO / "tools" / "devtools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["devtools"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@functools.cache
def tool(name: str) -> Path:
    """Path of a pinned tool (helm, kubectl, promtool, prometheus, hadolint); fetched on first
    use."""
    path: Path = devtools().ALL[name]().path
    return path


def run(
    argv: list[str | Path], *, check: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=False, **kwargs
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def helm_args(values: dict[str, Any] | None) -> list[str]:
    """`--set-json` for every top-level value (a values file without a file)."""
    out: list[str] = []
    for key, value in (values or {}).items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def render(
    values: dict[str, Any] | None = None,
    *,
    release: str = "dsv4-operator",
    namespace: str = "dsv4-system",
    extra: list[str] | None = None,
    tests: bool = False,
) -> list[dict[str, Any]]:
    """`helm template` of the chart: the rendered objects (CRDs included; the `helm test`
    hooks only with `tests`)."""
    proc = run(
        [
            tool("helm"),
            "template",
            release,
            CHART,
            "--namespace",
            namespace,
            "--include-crds",
            *([] if tests else ["--skip-tests"]),
            *helm_args(values),
            *(extra or []),
        ]
    )
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]
