"""Supported SGLang releases: flags, env registry, router flags and pool arithmetic, as data."""

from __future__ import annotations

import bisect
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
    matched_flags: tuple[str, ...] = ()

    @property
    def unknown(self) -> bool:
        return not self.options

    @property
    def ambiguous(self) -> bool:
        """More than one option string starts with the token: argparse (Python 3.11, the
        releases' own) refuses it even when the strings are aliases of one option."""
        return not self.exact and len(self.matched_flags) > 1

    @property
    def dests(self) -> frozenset[str]:
        return frozenset(o.dest for o in self.options)


@dataclass(frozen=True)
class ParserCatalog:
    """Every option string of one parser, as argparse resolves them (exact, then prefix)."""

    options: tuple[Option, ...]
    allow_abbrev: bool
    _by_flag: dict[str, Option] = field(init=False, repr=False, compare=False)
    _sorted: tuple[str, ...] = field(init=False, repr=False, compare=False)
    flags: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_flag = {f: o for o in self.options for f in o.flags}
        object.__setattr__(self, "_by_flag", by_flag)
        object.__setattr__(self, "_sorted", tuple(sorted(by_flag)))
        object.__setattr__(self, "flags", frozenset(by_flag))

    def resolve(self, token: str) -> Resolution:
        """Resolve `--name` or `--name=value` the way argparse's `_parse_optional` does."""
        name = token.split("=", 1)[0]
        exact = self._by_flag.get(name)
        if exact is not None:
            return Resolution(token, (exact,), exact=True)
        if not self.allow_abbrev:
            return Resolution(token, (), exact=False)
        # The flags a prefix starts are one run of the sorted flags (validating a spec resolves
        # every passthrough token of every role several times: a scan of all was most of it).
        start = bisect.bisect_left(self._sorted, name)
        end = start
        while end < len(self._sorted) and self._sorted[end].startswith(name):
            end += 1
        flags = self._sorted[start:end]
        options = tuple(dict.fromkeys(self._by_flag[flag] for flag in flags))
        return Resolution(token, options, exact=False, matched_flags=flags)

    def closest(self, token: str, n: int = 3) -> list[str]:
        """The real flags nearest to a misspelled one (for error messages)."""
        name = token.split("=", 1)[0]
        return difflib.get_close_matches(name, self._sorted, n=n, cutoff=0.6)


@dataclass(frozen=True)
class SourceLine:
    """Text the release's own source holds (a path under the `sglang` package): the proof of a
    fact, read by tests/conformance from the installed wheel."""

    file: str
    text: str


@dataclass(frozen=True)
class PairedSetting:
    """A setting the release requires or recommends to be equal on prefill and decode.

    `handshake` names the field of the PD bootstrap handshake (`PrefillServerInfo`) in which
    the decode server compares it; None when nothing compares it. `flags` and `env` are the
    spellings that set it (flags canonical, as in the release's parser).
    """

    setting: str
    flags: tuple[str, ...]
    env: tuple[str, ...]
    handshake: str | None
    on_mismatch: str
    proof: SourceLine | None


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
    pairing: tuple[PairedSetting, ...]
    sources: Mapping[str, str]

    @property
    def paired_flags(self) -> frozenset[str]:
        return frozenset(f for p in self.pairing for f in p.flags)

    @property
    def paired_env(self) -> frozenset[str]:
        return frozenset(e for p in self.pairing for e in p.env)

    def has_flag(self, flag: str) -> bool:
        return flag in self.engine.flags


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


def _source_line(raw: Mapping[str, str] | None) -> SourceLine | None:
    return SourceLine(file=raw["file"], text=raw["text"]) if raw else None


def _pairing(raw: list[Mapping[str, Any]]) -> tuple[PairedSetting, ...]:
    return tuple(
        PairedSetting(
            setting=p["setting"],
            flags=tuple(p.get("flags", ())),
            env=tuple(p.get("env", ())),
            handshake=p.get("handshake"),
            on_mismatch=p["onMismatch"],
            proof=_source_line(p.get("proof")),
        )
        for p in raw
    )


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
        pairing=_pairing(table["pairing"]),
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


def version_key(version: str) -> tuple[int, ...]:
    """Sortable form of a release version: "0.5.16" < "0.5.16.post1" < "0.5.23"."""
    return tuple(int(part.removeprefix("post")) for part in version.split("."))


def versions_text() -> str:
    """The supported releases, for messages: "0.5.23, 0.5.16"."""
    return ", ".join(supported_versions())
