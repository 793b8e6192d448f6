"""Supported SGLang releases: flags, env registry, router flags and pool arithmetic, as data."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

import yaml

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.roles import Role


class PoolArithmetic(StrEnum):
    """Which of SGLang's DSV4 pool-configurator generations a release runs."""

    RATIO = "dsv4-ratio"
    """0.5.16: 584 B rows, compress state per 128-token SWA page, SWA = full x ratio."""
    PAGED = "dsv4-paged"
    """0.5.23: page-padded rows (KV layout V4), compress state per 256-token storage page."""


@dataclass(frozen=True)
class Option:
    """One command-line option of a release's argparse parser."""

    flags: tuple[str, ...]
    dest: str
    takes_value: bool
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Resolution:
    """What a release's parser does with one `--flag` token of a passthrough argv."""

    token: str
    options: tuple[Option, ...]
    exact: bool

    @property
    def unknown(self) -> bool:
        return not self.options

    @property
    def ambiguous(self) -> bool:
        return len({o.dest for o in self.options}) > 1

    @property
    def dests(self) -> frozenset[str]:
        return frozenset(o.dest for o in self.options)


@dataclass(frozen=True)
class ParserCatalog:
    """Every option string of one parser, as argparse resolves them (exact, then prefix)."""

    options: tuple[Option, ...]
    allow_abbrev: bool
    _by_flag: dict[str, Option] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_flag", {f: o for o in self.options for f in o.flags})

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self._by_flag)

    def resolve(self, token: str) -> Resolution:
        """Resolve `--name` or `--name=value` the way argparse's `_parse_optional` does."""
        name = token.split("=", 1)[0]
        exact = self._by_flag.get(name)
        if exact is not None:
            return Resolution(token, (exact,), exact=True)
        if not self.allow_abbrev:
            return Resolution(token, (), exact=False)
        matches = tuple(
            dict.fromkeys(o for flag, o in sorted(self._by_flag.items()) if flag.startswith(name))
        )
        return Resolution(token, matches, exact=False)

    def closest(self, token: str, n: int = 3) -> list[str]:
        """The real flags nearest to a misspelled one (for error messages)."""
        name = token.split("=", 1)[0]
        return difflib.get_close_matches(name, sorted(self._by_flag), n=n, cutoff=0.6)


@dataclass(frozen=True)
class EngineRelease:
    """One supported SGLang release and what the operator knows about it."""

    version: str
    router_version: str
    cuda_graph_max_bs_flag: Mapping[Role, str]
    pool_arithmetic: PoolArithmetic
    fp4_indexer_archs: frozenset[str]
    native_capabilities: frozenset[Capability]
    engine: ParserCatalog
    router: ParserCatalog
    env: frozenset[str]
    sources: Mapping[str, str]


# Env names only a patched image understands, and the capability that declares them.
FORK_ENV: dict[str, Capability] = {"SGLANG_DSV4_BF16_INDEX_K": Capability.BF16_INDEX_K}


def _data(path: str) -> str:
    return resources.files("dsv4_operator.engine").joinpath("data", path).read_text("utf-8")


def _parser(raw: Mapping[str, Any]) -> ParserCatalog:
    options = tuple(
        Option(
            flags=tuple(o["flags"]),
            dest=o["dest"],
            takes_value=o["takesValue"],
            choices=tuple(o["choices"]) if o.get("choices") is not None else None,
        )
        for o in raw["options"]
    )
    return ParserCatalog(options=options, allow_abbrev=raw["allowAbbrev"])


def _release(version: str, table: Mapping[str, Any]) -> EngineRelease:
    catalog = json.loads(_data(f"sglang/{version}.json"))
    return EngineRelease(
        version=version,
        router_version=table["router"],
        cuda_graph_max_bs_flag=dict(table["cudaGraphMaxBsFlag"]),
        pool_arithmetic=PoolArithmetic(table["poolArithmetic"]),
        fp4_indexer_archs=frozenset(table["fp4IndexerArchs"]),
        native_capabilities=frozenset(Capability(c) for c in table["nativeCapabilities"]),
        engine=_parser(catalog["engine"]),
        router=_parser(catalog["router"]),
        env=frozenset(catalog["env"]),
        sources=dict(table["sources"]),
    )


@cache
def releases() -> dict[str, EngineRelease]:
    """Every supported release by version, newest first."""
    table: dict[str, Any] = yaml.safe_load(_data("releases.yaml"))
    return {version: _release(version, entry) for version, entry in table.items()}


def supported_versions() -> list[str]:
    return list(releases())


def release(version: str) -> EngineRelease | None:
    return releases().get(version)


def versions_text() -> str:
    """The supported releases, for messages: "0.5.23, 0.5.16"."""
    return ", ".join(supported_versions())
