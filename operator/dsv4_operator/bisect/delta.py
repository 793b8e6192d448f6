"""The configuration delta between a last known good and a rejected spec, as units (pure).

A unit is one setting that can be applied to the good spec alone: a spec field, one flag of
a passthrough argv (resolved through the release's own parser: aliases, `=` forms and
unambiguous prefixes are the same flag) or one env var. Parsing both specs fills their
defaults, so a default written out is no change; a unit that leaves every engine's argv, env,
image and GPUs as they were (revisions/hashing.config_hash) is no change either. Settings the
release pairs between prefill and decode (engine/data/releases.yaml `pairing`, the
transfer-format key's inputs) form one unit across spec.engine and both roles' overrides.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, JsonValue, ValidationError

from dsv4_operator.api.roles import ROLES
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.bisect import BisectModel
from dsv4_operator.bisect.entries import ARG_LISTS, ENV_LISTS, Entry, Wire, entries, pairing_groups
from dsv4_operator.engine.effective import effective_role, gpus_needed
from dsv4_operator.engine.flags import engine_launch, served_name
from dsv4_operator.engine.planner import PlanningError, plan
from dsv4_operator.engine.releases import release
from dsv4_operator.engine.validation import validate_spec
from dsv4_operator.revisions.hashing import config_hash
from dsv4_operator.trust import TrustPolicy

# The spec sections that shape the engines; the rest (guard, rollout, replicas, placement)
# never changes what a probe runs. A probe takes spec.safety from the rejected spec (the rule
# acknowledgements made for it) and everything else from the good one.
ENGINE_SECTIONS = ("model", "engine", "gpu", "prefill", "decode", "transfer", "workload")
ROLE_FIELDS = ("tensorParallel", "overrides")
# The image and what it is built on and declares move as one: a label never changes alone.
IMAGE_FIELDS = ("engine.image", "engine.sglangVersion", "engine.capabilities")
IMAGE_UNIT = "engine.image"


class Edit(BisectModel):
    """One change a unit makes to the good spec's wire form."""

    kind: Literal["field", "arg", "env"]
    path: str = Field(description="Dotted wire path of the field or of the argv/env list.")
    key: str = Field(default="", description="The canonical flag or env name in that list.")
    good: JsonValue = None
    bad: JsonValue = Field(default=None, description="None: unset in the rejected spec.")


class Unit(BisectModel):
    """A setting that differs: stable id, the name a person knows it by, both values."""

    id: str
    name: str
    good: str | None = Field(description="Its value in the good spec; None when unset.")
    bad: str | None = Field(description="Its value in the rejected spec; None when unset.")
    edits: list[Edit]


@dataclass(frozen=True)
class Delta:
    """The units between two specs, and the probe configuration of any subset of them."""

    good: Wire
    bad: Wire
    units: tuple[Unit, ...]
    policy: TrustPolicy = field(default_factory=TrustPolicy)

    @property
    def unit_ids(self) -> list[str]:
        return [u.id for u in self.units]

    def unit(self, unit_id: str) -> Unit:
        for unit in self.units:
            if unit.id == unit_id:
                return unit
        raise KeyError(unit_id)

    def spec_for(self, unit_ids: Iterable[str]) -> Wire:
        """The probe configuration: the good spec with these units applied (wire form)."""
        return _apply(self.good, self.bad, [self.unit(i) for i in unit_ids])

    @cached_property
    def good_errors(self) -> frozenset[tuple[str, str]]:
        """(rule, field) of every error the good spec itself has: not the units' doing."""
        return frozenset(
            (f.rule, f.field) for f in validate_spec(self.good, policy=self.policy).errors
        )

    def refusal(self, unit_ids: Sequence[str]) -> str | None:
        """Why engine/validation.py (schema, CEL mirrors, rules, safety policy) refuses the
        probe configuration, or None; errors the good spec already has do not count."""
        probe = validate_spec(self.spec_for(unit_ids), policy=self.policy)
        errors = [f for f in probe.errors if (f.rule, f.field) not in self.good_errors]
        return "; ".join(f"{f.rule} {f.field}: {f.message}" for f in errors) or None


def parse_spec(raw: Mapping[str, Any]) -> DSV4DeploymentSpec:
    """A spec mapping parsed (defaults filled); ValueError naming the first bad field."""
    try:
        return DSV4DeploymentSpec.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"spec.{where}: {first['msg']}") from error


def compute_delta(
    good: Mapping[str, Any], bad: Mapping[str, Any], policy: TrustPolicy | None = None
) -> Delta:
    """The units between a last known good spec and a rejected one (both spec mappings)."""
    good_spec, bad_spec = parse_spec(good), parse_spec(bad)
    good_wire, bad_wire = good_spec.to_wire(), bad_spec.to_wire()
    units = [*_field_units(good_wire, bad_wire), *_list_units(good_spec, bad_spec)]
    candidate = Delta(good_wire, bad_wire, tuple(units), policy or TrustPolicy())
    return Delta(good_wire, bad_wire, tuple(_changes(candidate)), candidate.policy)


def fingerprint(wire: Wire) -> str | None:
    """What the engines of a spec run (image, argv, env, GPUs per role), or None when the
    spec cannot be planned."""
    try:
        spec = DSV4DeploymentSpec.model_validate(wire)
        the_plan = plan(spec)
    except (ValidationError, PlanningError):
        return None
    served = served_name(spec, the_plan.profiles.model.served_name)
    launches = {role: engine_launch(spec, the_plan, role, served) for role in ROLES}
    gpus = {role: gpus_needed(effective_role(spec, role)) for role in ROLES}
    return config_hash(spec.engine.image, launches, gpus)


# --- spec fields ---------------------------------------------------------------------------


def _leaves(wire: Wire) -> dict[str, JsonValue]:
    """Dotted path -> value of every engine-shaping field (lists are values; the argv and env
    lists are handled per entry)."""
    out: dict[str, JsonValue] = {}

    def walk(prefix: str, value: Any) -> None:
        if prefix in ARG_LISTS or prefix in ENV_LISTS:
            return
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        else:
            out[prefix] = sorted(value) if prefix == "engine.capabilities" else value

    for section in ENGINE_SECTIONS:
        value = wire.get(section)
        if section in ROLES and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k in ROLE_FIELDS}
        if value is not None:
            walk(section, value)
    return out


def _text(value: JsonValue) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _field_units(good: Wire, bad: Wire) -> list[Unit]:
    old, new = _leaves(good), _leaves(bad)
    paths = [*old, *(p for p in new if p not in old)]
    changed = [p for p in paths if old.get(p) != new.get(p)]
    image = [p for p in changed if p in IMAGE_FIELDS]
    units = [
        Unit(
            id=p,
            name=f"spec.{p}",
            good=_text(old.get(p)),
            bad=_text(new.get(p)),
            edits=[Edit(kind="field", path=p, good=old.get(p), bad=new.get(p))],
        )
        for p in changed
        if p not in IMAGE_FIELDS
    ]
    if image:
        units.insert(
            0,
            Unit(
                id=IMAGE_UNIT,
                name="spec.engine.image",
                good=" ".join(f"{p.split('.')[-1]}={_text(old.get(p))}" for p in image),
                bad=" ".join(f"{p.split('.')[-1]}={_text(new.get(p))}" for p in image),
                edits=[Edit(kind="field", path=p, good=old.get(p), bad=new.get(p)) for p in image],
            ),
        )
    return units


# --- passthrough argv and env --------------------------------------------------------------


def _scope(path: str) -> str:
    return path.split(".")[0]


def _describe(edit: Edit, bad: bool) -> str | None:
    value = edit.bad if bad else edit.good
    if value is None:
        return None
    if edit.kind == "arg" and isinstance(value, list):
        return _arg_text([str(v) for v in value])
    return str(value)


def _arg_text(tokens: Sequence[str]) -> str:
    """A flag's value(s) as a person reads them: `4096`, `on` for a switch, `off` for --no-x."""
    out: list[str] = []
    for i, token in enumerate(tokens):
        if not token.startswith("--"):
            out.append(token)
            continue
        name, eq, inline = token.partition("=")
        if eq:
            out.append(inline)
        elif i + 1 == len(tokens) or tokens[i + 1].startswith("--"):
            out.append("off" if name.startswith("--no-") else "on")
    return " ".join(out)


def _list_units(good: DSV4DeploymentSpec, bad: DSV4DeploymentSpec) -> list[Unit]:
    good_wire, bad_wire = good.to_wire(), bad.to_wire()
    paired = pairing_groups(
        [release(good.engine.sglang_version), release(bad.engine.sglang_version)]
    )
    grouped: dict[str, list[Edit]] = {}
    for path in (*ARG_LISTS, *ENV_LISTS):
        kind: Literal["arg", "env"] = "arg" if path in ARG_LISTS else "env"
        old, new = entries(good_wire, path), entries(bad_wire, path)
        for key in [*old, *(k for k in new if k not in old)]:
            before, after = old.get(key), new.get(key)
            if (before.values if before else None) == (after.values if after else None):
                continue  # aliases, `=` forms and prefixes resolve to the same flag and value
            edit = Edit(
                kind=kind,
                path=path,
                key=key,
                good=_tokens(before, kind),
                bad=_tokens(after, kind),
            )
            unit_id = f"paired:{paired[key]}" if key in paired else f"{path}:{key}"
            grouped.setdefault(unit_id, []).append(edit)
    return [_list_unit(unit_id, edits) for unit_id, edits in grouped.items()]


def _tokens(entry: Entry | None, kind: str) -> JsonValue:
    if entry is None:
        return None
    if kind == "env":
        return entry.tokens[-1]
    return list(entry.tokens)


def _list_unit(unit_id: str, edits: list[Edit]) -> Unit:
    scopes = {_scope(e.path) for e in edits}
    keys = ", ".join(dict.fromkeys(e.key for e in edits))
    if scopes == {"engine"} or len(edits) == 1:
        (scope,) = scopes
        name = keys if scope == "engine" else f"{keys} ({scope})"
    else:
        name = f"{keys} ({', '.join(sorted(scopes))})"

    def side(bad: bool) -> str | None:
        described = [_describe(e, bad) for e in edits]
        if all(d is None for d in described):
            return None
        if len(scopes) == 1:
            return " ".join(d for d in described if d is not None)
        return "; ".join(
            f"{_scope(e.path)}: {d or 'unset'}" for e, d in zip(edits, described, strict=True)
        )

    return Unit(id=unit_id, name=name, good=side(bad=False), bad=side(bad=True), edits=edits)


# --- applying units ------------------------------------------------------------------------


def _set(wire: Wire, path: str, value: JsonValue) -> None:
    *parents, last = path.split(".")
    node = wire
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


def _apply(good: Wire, bad: Wire, units: Sequence[Unit]) -> Wire:
    probe = copy.deepcopy(good)
    if "safety" in bad:
        probe["safety"] = copy.deepcopy(bad["safety"])
    same_image = good.get("engine", {}).get("image") == bad.get("engine", {}).get("image")
    if same_image and "capabilities" in bad.get("engine", {}):
        # Capabilities are the image's labels: for one image the later declaration holds.
        probe["engine"]["capabilities"] = copy.deepcopy(bad["engine"]["capabilities"])
    lists: dict[str, dict[str, Edit]] = {}
    for unit in units:
        for edit in unit.edits:
            if edit.kind == "field":
                _set(probe, edit.path, edit.bad)
            else:
                lists.setdefault(edit.path, {})[edit.key] = edit
    for path, edits in lists.items():
        _set(probe, path, _rebuilt(good, path, edits))
    return probe


def _rebuilt(good: Wire, path: str, edits: Mapping[str, Edit]) -> list[Any]:
    """The good spec's list at `path` with these entries replaced, removed or added."""
    present = entries(good, path)
    keys = [*present, *(k for k in edits if k not in present)]
    out: list[Any] = []
    for key in keys:
        if key in edits:
            value = edits[key].bad
        else:
            value = _tokens(present[key], "arg" if path in ARG_LISTS else "env")
        if value is None:
            continue
        if path in ARG_LISTS and isinstance(value, list):
            out.extend(value)
        else:
            out.append({"name": key, "value": value})
    return out


def _changes(delta: Delta) -> list[Unit]:
    """The units that change what some engine runs, alone on the good spec or taken away
    from the rejected one (e.g. hicache.ratio matters only with HiCache on)."""
    every = delta.unit_ids
    good_print = fingerprint(delta.spec_for([]))
    bad_print = fingerprint(delta.spec_for(every))
    if good_print is None or bad_print is None:
        return list(delta.units)
    return [
        unit
        for unit in delta.units
        if fingerprint(delta.spec_for([unit.id])) != good_print
        or fingerprint(delta.spec_for([u for u in every if u != unit.id])) != bad_print
    ]
