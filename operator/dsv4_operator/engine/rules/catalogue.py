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
from dsv4_operator.engine.effective import EffectiveRole, effective_role, parse_args
from dsv4_operator.engine.planner import MemoryPlan, Profiles
from dsv4_operator.engine.releases import (
    EngineRelease,
    SourceLine,
    supported_versions,
    version_key,
)

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

    def flag_field(self, role: Role, flag: str) -> str:
        """Where a role's passthrough flag is set: its overrides when they set it, else
        spec.engine (the finding names the field to change)."""
        eff = self.roles[role]
        if flag in parse_args(eff.role_extra_args, eff.catalog):
            return f"spec.{role}.overrides.extraArgs"
        return "spec.engine.extraArgs"

    def env_field(self, role: Role, name: str) -> str:
        """Where a role's passthrough env var is set (its overrides win over spec.engine)."""
        if any(e.name == name for e in self.spec.role(role).overrides.env):
            return f"spec.{role}.overrides.env"
        return "spec.engine.env"

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
class Change:
    """The release in which a rule's condition appeared or went away upstream.

    `proof` is a line of that release's own source (present from `version` on, absent
    before); tests/conformance reads it in every supported release's wheel. `ref` names the
    upstream issue or pull request.
    """

    version: str
    ref: str = ""
    proof: SourceLine | None = None

    def as_dict(self) -> dict[str, object]:
        return {"version": self.version, "ref": self.ref or None}

    def describe(self, what: str) -> str:
        """ "fixed in 0.5.23 by PR #31901", or for a related fix "PR #26380 ... fixed in 0.5.14"."""
        if what == "related":
            return f"related: {self.ref} fixed in {self.version}"
        return f"{what} in {self.version}" + (f" by {self.ref}" if self.ref else "")


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
    introduced_in: Change | None
    fixed_in: Change | None
    # Upstream fixes of problems the rule once also covered: they no longer count in any
    # release from their version on (the rule's text no longer cites them there).
    related_fixes: tuple[Change, ...]
    check: RuleCheck

    @property
    def releases(self) -> tuple[str, ...]:
        """The supported releases the rule applies to: from introducedIn, before fixedIn."""
        return tuple(v for v in supported_versions() if self.applies_to(v))

    def applies_to(self, version: str) -> bool:
        key = version_key(version)
        if self.introduced_in is not None and key < version_key(self.introduced_in.version):
            return False
        return self.fixed_in is None or key < version_key(self.fixed_in.version)

    def history(self) -> str:
        """introducedIn, fixedIn and the related fixes in words ("" when none)."""
        parts = [self.introduced_in.describe("introduced")] if self.introduced_in else []
        parts += [self.fixed_in.describe("fixed")] if self.fixed_in else []
        parts += [c.describe("related") for c in self.related_fixes]
        return "; ".join(parts)

    def changes(self) -> Iterator[Change]:
        """Every release change the rule records (the ones with a proof are checked)."""
        for change in (self.introduced_in, self.fixed_in, *self.related_fixes):
            if change is not None:
                yield change

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
            "introducedIn": self.introduced_in.as_dict() if self.introduced_in else None,
            "fixedIn": self.fixed_in.as_dict() if self.fixed_in else None,
            "relatedFixes": [c.as_dict() for c in self.related_fixes],
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
    introduced_in: Change | None = None,
    fixed_in: Change | None = None,
    related_fixes: tuple[Change, ...] = (),
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
            introduced_in=introduced_in,
            fixed_in=fixed_in,
            related_fixes=related_fixes,
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
