"""Passthrough rules: extraArgs and env set no name the operator owns and none the release lacks."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from dsv4_operator.engine.ownership import OWNED_ENV, OWNED_FLAGS
from dsv4_operator.engine.releases import FORK_ENV, Option
from dsv4_operator.engine.rules.catalogue import NOTES, Hit, RuleContext, rule


@rule(
    "DSV4-R013",
    "passthrough sets a flag or env var the operator owns",
    "error",
    reference=f"{NOTES}#owned-flags",
    reads=("engine.extraArgs", "engine.env", "<role>.overrides"),
    ack=False,
)
def passthrough_sets_owned(ctx: RuleContext) -> Iterator[Hit]:
    parser = ctx.release.engine
    for prefix, args, env_names in ctx.passthrough():
        for token in args:
            if not token.startswith("--"):
                continue
            resolution = parser.resolve(token)
            owned = sorted(
                {f for o in resolution.options for f in _spellings(o) if f in OWNED_FLAGS}
            )
            if owned:
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{token.split('=', 1)[0]} "
                    f"{'can resolve' if resolution.ambiguous else 'resolves'} to {owned[0]}, "
                    "which the operator owns; "
                    f"use {OWNED_FLAGS[owned[0]]} instead.",
                )
        for name in env_names:
            if name in OWNED_ENV:
                yield Hit(
                    f"{prefix}.env",
                    f"{name} is owned by the operator; use {OWNED_ENV[name]} instead.",
                )


def _spellings(option: Option) -> set[str]:
    """Every name of an option, including the canonical one the ownership table uses."""
    return {*option.flags, "--" + option.dest.replace("_", "-")}


@rule(
    "DSV4-R018",
    "passthrough flag the release's parser does not accept",
    "error",
    reference=f"{NOTES}#supported-releases",
    reads=("engine.extraArgs", "<role>.overrides.extraArgs", "engine.sglangVersion"),
    ack=False,
)
def flag_unknown_to_release(ctx: RuleContext) -> Iterator[Hit]:
    parser, version = ctx.release.engine, ctx.release.version
    for prefix, args, _ in ctx.passthrough():
        for token in args:
            if not token.startswith("--"):
                continue
            resolution = parser.resolve(token)
            name = token.split("=", 1)[0]
            if resolution.unknown:
                near = parser.closest(name)
                hint = f"; did you mean {' or '.join(near)}?" if near else ""
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{name} is not a flag of SGLang {version}: its parser would refuse to "
                    f"start{hint}",
                )
            elif resolution.ambiguous:
                matches = ", ".join(sorted(f for o in resolution.options for f in o.flags)[:6])
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{name} is an ambiguous abbreviation for SGLang {version} (could match "
                    f"{matches}): its parser would refuse to start. Spell the flag out.",
                )


@rule(
    "DSV4-R019",
    "passthrough env name the release does not know",
    "warning",
    reference=f"{NOTES}#supported-releases",
    reads=("engine.env", "<role>.overrides.env", "engine.sglangVersion"),
)
def env_unknown_to_release(ctx: RuleContext) -> Iterator[Hit]:
    known = ctx.release.env
    for prefix, _, env_names in ctx.passthrough():
        for name in env_names:
            if not name.startswith("SGLANG_") or name in known or name in FORK_ENV:
                continue
            near = _closest(name, known)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            yield Hit(
                f"{prefix}.env",
                f"{name} is not in SGLang {ctx.release.version}'s environment registry, so the "
                f"engine ignores it{hint}",
            )


def _closest(name: str, known: frozenset[str]) -> list[str]:
    return difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.8)
