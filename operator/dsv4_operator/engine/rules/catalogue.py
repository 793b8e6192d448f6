"""The catalogue's machinery: a rule's metadata, the facts its check reads, registration and
the run over the catalogue. The rules themselves live beside it, one module per family.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.roles import ROLES, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import Severity
from dsv4_operator.engine.effective import EffectiveRole, effective_role
from dsv4_operator.engine.planner import MemoryPlan, Profiles
from dsv4_operator.engine.releases import EngineRelease, supported_versions

NOTES = "docs/engine-notes.md"


@dataclass(frozen=True)
class Hit:
    """A rule's condition holds: where, and what to tell the user."""

    field: str
    message: str


@dataclass(frozen=True)
class RuleContext:
    """Facts every check reads; built once per validation."""

    spec: DSV4DeploymentSpec
    profiles: Profiles
    plan: MemoryPlan
    roles: dict[Role, EffectiveRole]

    @property
    def release(self) -> EngineRelease:
        return self.profiles.release

    @property
    def bf16(self) -> bool:
        return self.spec.engine.index_k_dtype == "bf16"

    def has(self, capability: Capability) -> bool:
        return capability in self.spec.engine.capabilities

    def passthrough(self) -> Iterator[tuple[str, tuple[str, ...], list[str]]]:
        """(spec path, extraArgs, env names) of the engine-wide and per-role passthroughs."""
        engine = self.spec.engine
        yield "spec.engine", tuple(engine.extra_args), [e.name for e in engine.env]
        for role in ROLES:
            o = self.spec.role(role).overrides
            yield f"spec.{role}.overrides", tuple(o.extra_args), [e.name for e in o.env]


# A rule's check: a Hit wherever the rule's condition holds.
RuleCheck = Callable[[RuleContext], Iterator[Hit]]


@dataclass(frozen=True)
class Rule:
    """One catalogue entry: its metadata and its check."""

    id: str
    title: str
    severity: Severity
    acknowledgeable: bool
    reference: str
    fixed_by: Capability | None
    reads: tuple[str, ...]
    releases: tuple[str, ...]
    check: RuleCheck

    def applies_to(self, version: str) -> bool:
        return version in self.releases

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "title": self.title,
            "severity": self.severity,
            "acknowledgeable": self.acknowledgeable,
            "reference": self.reference,
            "fixedBy": self.fixed_by.value if self.fixed_by else None,
            "reads": list(self.reads),
            "releases": list(self.releases),
        }


CATALOGUE: list[Rule] = []  # in id order, whatever order the families register in
RULES_BY_ID: dict[str, Rule] = {}


def rule(
    id: str,
    title: str,
    severity: Severity,
    *,
    reference: str,
    reads: tuple[str, ...],
    ack: bool = True,
    fixed_by: Capability | None = None,
    releases: tuple[str, ...] | None = None,
) -> Callable[[RuleCheck], RuleCheck]:
    """Register the decorated check in the catalogue (kept in id order)."""

    def register(check: RuleCheck) -> RuleCheck:
        entry = Rule(
            id=id,
            title=title,
            severity=severity,
            acknowledgeable=ack,
            reference=reference,
            fixed_by=fixed_by,
            reads=reads,
            releases=releases if releases is not None else tuple(supported_versions()),
            check=check,
        )
        if id in RULES_BY_ID:
            raise ValueError(f"rule {id} is registered twice")
        bisect.insort(CATALOGUE, entry, key=lambda r: r.id)
        RULES_BY_ID[id] = entry
        return check

    return register


def context(spec: DSV4DeploymentSpec, profiles: Profiles, plan: MemoryPlan) -> RuleContext:
    return RuleContext(
        spec=spec,
        profiles=profiles,
        plan=plan,
        roles={role: effective_role(spec, role) for role in ROLES},
    )


def run_rules(ctx: RuleContext) -> list[tuple[Rule, Hit]]:
    """Every (rule, hit) of the rules that apply to the spec's release, in catalogue order."""
    version = ctx.release.version
    return [(r, hit) for r in CATALOGUE if r.applies_to(version) for hit in r.check(ctx)]
