"""Typed `DSV4Deployment.spec`, the API contract's root: its sections and the rules across them.

Each section lives in its own module (model, engine, roles, guard, policy; bounds in limits);
docs/crd-reference.md is generated from them all.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from dsv4_operator.api.base import ApiModel
from dsv4_operator.api.engine import EngineSpec
from dsv4_operator.api.guard import GuardSpec
from dsv4_operator.api.limits import ENGINE_PORT
from dsv4_operator.api.model import ModelSpec
from dsv4_operator.api.pod import PodSettings
from dsv4_operator.api.policy import MonitoringSpec, RolloutSpec, SafetySpec
from dsv4_operator.api.roles import (
    ROLES,
    GpuSpec,
    Role,
    RoleSpec,
    RouterSpec,
    TransferSpec,
    WorkloadSpec,
)

# A replica may span nodes (tensorParallel a multiple of gpu.perNode): DSV4-R007 checks the
# parallelism against the node, with the passthrough flags the schema cannot see.
_SPEC_RULES: list[JsonDict] = [
    {
        "rule": "self.workload.contextTokens <= self.engine.contextLength",
        "message": "spec.workload.contextTokens must not exceed spec.engine.contextLength",
        "fieldPath": ".workload.contextTokens",
    },
    {
        "rule": f"self.transfer.bootstrapPort != {ENGINE_PORT}",
        "message": "spec.transfer.bootstrapPort must differ from the engine HTTP port "
        f"{ENGINE_PORT}",
        "fieldPath": ".transfer.bootstrapPort",
    },
]


# Deployment's default: a step that has not moved in ten minutes is stuck, not slow.
PROGRESS_DEADLINE_SECONDS = 600


class DSV4DeploymentSpec(ApiModel):
    """Desired state of a PD-disaggregated DeepSeek-V4-class deployment on SGLang."""

    model_config = ApiModel.with_cel(*_SPEC_RULES)

    model: ModelSpec = Field(description="The model to serve.")
    engine: EngineSpec = Field(description="One engine configuration shared by both roles.")
    gpu: GpuSpec = Field(default_factory=GpuSpec, description="GPU product.")
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="Prefill role.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="Decode role.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="Router.")
    transfer: TransferSpec = Field(default_factory=TransferSpec, description="KV transfer.")
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec, description="Capacity target.")
    safety: SafetySpec = Field(default_factory=SafetySpec, description="Rule gating.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rollout strategy.")
    progress_deadline_seconds: int = Field(
        default=PROGRESS_DEADLINE_SECONDS,
        ge=1,
        le=7 * 24 * 3600,
        description="Seconds a rollout step may make no progress before the deployment is "
        "Degraded (ProgressDeadlineExceeded, phase Failed), like a Deployment's; a running "
        "weights download with figures is progress.",
    )
    guard: GuardSpec = Field(default_factory=GuardSpec, description="Leak/OOM guard and rollback.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Scraping.")
    pod_template: PodSettings = Field(
        default_factory=PodSettings,
        description="Pod settings for every pod (pull secrets, service account, placement, "
        "security context, extra volumes and env); overridable per role.",
    )

    def role(self, role: Role) -> RoleSpec:
        return self.prefill if role == "prefill" else self.decode

    def pod_settings(self, component: Role | Literal["router"]) -> PodSettings:
        """spec.podTemplate with the component's own on top."""
        own = (
            self.router.pod_template if component == "router" else self.role(component).pod_template
        )
        return self.pod_template.merged(own)

    @model_validator(mode="after")
    def _pod_settings_consistent(self) -> DSV4DeploymentSpec:
        for component in ("prefill", "decode", "router"):
            self.pod_settings(component).check_mounts(component)
        for role in ROLES:
            engine_env = {e.name for e in (*self.engine.env, *self.role(role).overrides.env)}
            if clash := sorted(engine_env & {e.name for e in self.pod_settings(role).env}):
                raise ValueError(
                    f"{role} podTemplate.env: {', '.join(clash)} also in spec.engine.env or "
                    f"spec.{role}.overrides.env: set each variable in one place"
                )
        return self
