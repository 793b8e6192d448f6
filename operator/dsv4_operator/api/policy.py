"""How findings gate a rollout, how it rolls and how it is scraped (safety, rollout, monitoring)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.kube_types import LabelKey, LabelValue
from dsv4_operator.api.limits import ScrapeInterval
from dsv4_operator.api.times import Duration


class SafetyPolicy(StrEnum):
    ENFORCE = "Enforce"
    WARN = "Warn"


class SafetySpec(ApiModel):
    """How rule findings gate a rollout."""

    policy: SafetyPolicy = Field(
        default=SafetyPolicy.ENFORCE,
        description="Enforce rejects error findings unless acknowledged; Warn records them.",
    )
    acknowledge: list[Annotated[str, Field(pattern=r"^DSV4-R\d{3}$", max_length=9)]] = Field(
        default_factory=list,
        max_length=64,
        description="Rule ids whose errors are accepted (reported as warnings).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class RolloutSpec(ApiModel):
    """How a new engine configuration replaces the running one."""

    strategy: Literal["Auto", "Recreate", "BlueGreen"] = Field(
        default="Auto",
        description="Auto rolls compatible changes role by role and uses Recreate for "
        "transfer-format changes; BlueGreen brings up a new pair, then switches the router.",
    )


class ServiceMonitorSpec(ApiModel):
    """A prometheus-operator ServiceMonitor for the engines and the router."""

    enabled: bool = Field(default=False, description="Render a ServiceMonitor.")
    interval: ScrapeInterval = Field(
        default=Duration("30s"), description="Scrape interval (5s to 1h)."
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=32, description="Extra labels (for selectors)."
    )


class MonitoringSpec(ApiModel):
    """Scraping of sglang:* and router metrics."""

    service_monitor: ServiceMonitorSpec = Field(
        default_factory=ServiceMonitorSpec, description="ServiceMonitor."
    )
