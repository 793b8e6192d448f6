"""A real Prometheus server (Debian's, see tools/devtools.py) as a child process: scrapes
targets the way the ServiceMonitors would have prometheus-operator scrape them, evaluates rule
files, and answers PromQL through its HTTP API.

    prom = PrometheusProcess(binary, workdir, [ScrapeJob(...)], [rules_path]).start()
    prom.query('dsv4_leak_rate')       # instant vector: [{"metric": {...}, "value": [t, "v"]}]
    prom.alerts()                      # active alerts (pending and firing)

There is no Kubernetes service discovery here (kwok runs no container, and the targets are
processes on 127.0.0.1): each target is a static one carrying the `__meta_kubernetes_*` labels
discovery would have given its pod, and a ServiceMonitor endpoint's `honorLabels` and
`relabelings` are applied to it as prometheus-operator does (`scrape_job`).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dsv4_devcluster.process import ManagedProcess, free_port, wait_for

_DURATION = re.compile(r"(\d+)([smh])\b")
_UNIT = {"s": 1, "m": 60, "h": 3600}


def _scaled(text: str, scale: int) -> str:
    def one(match: re.Match[str]) -> str:
        return f"{max(1, int(match[1]) * _UNIT[match[2]] // scale)}s"

    return _DURATION.sub(one, text)


def scale_rules(source: Path, dest: Path, scale: int, for_scale: int | None = None) -> Path:
    """A copy of the rules file `source` at `dest` with every `for:`, every range or offset and
    every age in seconds (`time() - ... > N`) divided by `scale` (at least 1s), so an alert
    fires and resolves within a test or a demo; the `for:` durations by `for_scale` if given
    (a window must still hold enough samples and events, a hold need not). Thresholds and the
    expressions' shape stay."""
    rules = yaml.safe_load(source.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = _scaled(rule["for"], for_scale or scale)
            # Only durations inside [...] and after `offset`: numbers elsewhere are thresholds.
            expr = re.sub(r"\[[^\]]+\]", lambda m: _scaled(m[0], scale), rule["expr"])
            expr = re.sub(r"offset \w+", lambda m: _scaled(m[0], scale), expr)
            rule["expr"] = re.sub(
                r"(time\(\) - [^>]*> )(\d+)", lambda m: f"{m[1]}{max(1, int(m[2]) // scale)}", expr
            )
    dest.write_text(yaml.safe_dump(rules, sort_keys=False))
    return dest


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


@dataclass(frozen=True)
class PodTarget:
    """What Kubernetes discovery knows of one scraped pod: where, its namespace, its labels."""

    address: str  # host:port
    namespace: str
    pod: str
    service: str
    labels: dict[str, str] = field(default_factory=dict)

    def meta(self) -> dict[str, str]:
        meta = {
            "__meta_kubernetes_namespace": self.namespace,
            "__meta_kubernetes_pod_name": self.pod,
            "__meta_kubernetes_service_name": self.service,
        }
        for key, value in self.labels.items():
            meta["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
        return meta


def scrape_job(
    job: str, endpoint: dict[str, Any], targets: list[PodTarget], interval: str = "1s"
) -> dict[str, Any]:
    """A Prometheus scrape_config for a ServiceMonitor `endpoint` over `targets`: the target
    labels prometheus-operator sets first (namespace, pod, service, endpoint, job), then the
    endpoint's own `relabelings`, with its `honorLabels`."""
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"target_label": "endpoint", "replacement": str(endpoint.get("port", ""))},
        {"target_label": "job", "replacement": job},
    ]
    for rule in endpoint.get("relabelings", []):
        relabel.append({_snake(k): v for k, v in rule.items()})
    return {
        "job_name": job,
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": endpoint.get("path", "/metrics"),
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "static_configs": [{"targets": [t.address], "labels": t.meta()} for t in targets],
        "relabel_configs": relabel,
    }


class PrometheusProcess:
    """`prometheus` on 127.0.0.1 with the given scrape jobs and rule files, evaluating every
    `interval` (scrapes and rules alike)."""

    def __init__(
        self,
        binary: Path,
        workdir: Path,
        jobs: list[dict[str, Any]],
        rule_files: list[Path],
        interval: str = "1s",
    ) -> None:
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": jobs,
        }
        self.process: ManagedProcess | None = None

    def start(self) -> PrometheusProcess:
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.process = ManagedProcess(
            "prometheus",
            [
                str(self.binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            self.workdir / "prometheus.log",
        )
        wait_for("prometheus ready", self._ready, timeout=60, process=self.process)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines) if self.process is not None else ""

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)

    def api(self, path: str, **params: str) -> Any:
        """The `data` of GET /api/v1/<path>; an error status raises with Prometheus's message."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of `expr` now."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts: labels, state (pending or firing), value."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def rule_health(self) -> list[tuple[str, str, str]]:
        """(rule name, health, last error) of every loaded rule."""
        groups = self.api("rules")["groups"]
        return [
            (r["name"], r.get("health", ""), r.get("lastError", ""))
            for g in groups
            for r in g["rules"]
        ]

    def label_names(self, metric: str) -> set[str]:
        """The label names of every series of `metric` Prometheus holds."""
        series = self.api("series", **{"match[]": metric})
        return {name for s in series for name in s if name != "__name__"}
