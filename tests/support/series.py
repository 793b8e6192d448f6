"""The label names of every family the operator and the leak tap export, read from their
prometheus_client objects (no process, no socket): what the vocabulary tests compare."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from dsv4_operator import metrics as operator_metrics
from dsv4_operator.tap.metrics import TapMetrics
from dsv4_operator.tap.proxy import TapConfig
from dsv4_operator.tap.worker import ClassifierLink
from dsv4_operator.tap.workers import WorkerPool, pool_collector

# Labels a histogram's or a summary's samples add to the family's own.
SAMPLE_LABELS = frozenset({"le", "quantile"})


def operator_families() -> dict[str, tuple[str, ...]]:
    """Exported sample family name (a counter's with `_total`) -> label names, `dsv4 run`."""
    families: dict[str, tuple[str, ...]] = {}
    for value in vars(operator_metrics).values():
        if isinstance(value, MetricWrapperBase):
            (family,) = value.describe()
            name = f"{family.name}_total" if family.type == "counter" else family.name
            # A labelled metric has no sample before its first child: the declared names.
            families[name] = tuple(value._labelnames)
    return families


def tap_families(scope: tuple[str, str] = ("ns", "d")) -> dict[str, tuple[str, ...]]:
    """The same for `dsv4 tap` (one relay's registry and what `--workers` adds)."""
    pool = WorkerPool(
        TapConfig("http://127.0.0.1:9", scope[1], namespace=scope[0]),
        ("127.0.0.1", 0),
        0,
        Path("/"),
    )
    collected = [
        *TapMetrics(ClassifierLink(), scope).registry.collect(),
        *pool_collector(pool, scope).collect(),
    ]
    families: dict[str, tuple[str, ...]] = {}
    for family in collected:
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = (k for s in family.samples for k in s.labels if k not in SAMPLE_LABELS)
        families[name] = tuple(dict.fromkeys(labels))
    return families
