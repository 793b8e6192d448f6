"""The passthrough argv and env lists of a spec as the release's parser reads them (pure):
canonical flag or env name -> its tokens and comparable values, and the pairing groups."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4_operator.engine.effective import canonical_flag
from dsv4_operator.engine.releases import EngineRelease, ParserCatalog, release

Wire = dict[str, Any]
ARG_LISTS = ("engine.extraArgs", "prefill.overrides.extraArgs", "decode.overrides.extraArgs")
ENV_LISTS = ("engine.env", "prefill.overrides.env", "decode.overrides.env")
POSITIONAL = "<positional>"


@dataclass
class Entry:
    """One flag (all its occurrences) or env var of a list: its tokens and comparable value."""

    tokens: list[str] = field(default_factory=list)
    values: list[str | None] = field(default_factory=list)


def catalog_of(wire: Wire) -> ParserCatalog | None:
    engine_release = release(str(wire.get("engine", {}).get("sglangVersion", "")))
    return engine_release.engine if engine_release is not None else None


def arg_entries(args: Sequence[str], catalog: ParserCatalog | None) -> dict[str, Entry]:
    """Canonical flag -> its tokens and values, as the release's parser reads the argv
    (engine/effective.py parse_args, keeping every token so the argv can be rebuilt)."""
    entries: dict[str, Entry] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            entry = entries.setdefault(POSITIONAL, Entry())
            entry.tokens.append(token)
            entry.values.append(token)
            i += 1
            continue
        name, eq, inline = token.partition("=")
        flag, option = canonical_flag(name, catalog)
        entry = entries.setdefault(flag, Entry())
        entry.tokens.append(token)
        switch = option is not None and not option.takes_value
        if eq:
            entry.values.append(inline)
        elif not switch and i + 1 < len(args) and not args[i + 1].startswith("--"):
            entry.tokens.append(args[i + 1])
            entry.values.append(args[i + 1])
            i += 1
        else:
            entry.values.append("off" if _negated(name, flag, catalog) else None)
        i += 1
    return entries


def _negated(name: str, flag: str, catalog: ParserCatalog | None) -> bool:
    """`--no-x` of a BooleanOptionalAction shares the destination of `--x`: not the same."""
    if catalog is None:
        return False
    resolution = catalog.resolve(name)
    spelled = name if resolution.exact else next(iter(resolution.matched_flags), name)
    return spelled.startswith("--no-") and not flag.startswith("--no-")


def env_entries(env: Sequence[Mapping[str, Any]]) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for item in env:
        value = str(item.get("value", ""))
        entries[str(item["name"])] = Entry(tokens=[value], values=[value])
    return entries


def list_at(wire: Wire, path: str) -> list[Any]:
    node: Any = wire
    for part in path.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, list) else []


def entries(wire: Wire, path: str) -> dict[str, Entry]:
    items = list_at(wire, path)
    return arg_entries(items, catalog_of(wire)) if path in ARG_LISTS else env_entries(items)


def pairing_groups(releases: Iterable[EngineRelease | None]) -> dict[str, str]:
    """Flag or env name -> the id of its pairing group (settings sharing a name are one)."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    for engine_release in releases:
        for setting in engine_release.pairing if engine_release is not None else ():
            for name in (*setting.flags, *setting.env):
                parent[root(f"name:{name}")] = root(setting.setting)
    names = [n for n in parent if n.startswith("name:")]
    members: dict[str, list[str]] = {}
    for node in parent:
        if not node.startswith("name:"):
            members.setdefault(root(node), []).append(node)
    return {n.removeprefix("name:"): "+".join(sorted(members[root(n)])) for n in names}
