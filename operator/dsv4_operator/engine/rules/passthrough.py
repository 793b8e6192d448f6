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
                one_sided = ""
                if prefix != "spec.engine" and owned[0] in ctx.release.paired_flags:
                    role = prefix.split(".")[1]
                    one_sided = (
                        f" Set for {role} only it would also differ between the roles, and "
                        f"SGLang {ctx.release.version} needs it equal on prefill and decode."
                    )
                yield Hit(
                    f"{prefix}.extraArgs",
                    f"{token.split('=', 1)[0]} "
                    f"{'can resolve' if resolution.ambiguous else 'resolves'} to {owned[0]}, "
                    "which the operator owns; "
                    f"use {OWNED_FLAGS[owned[0]]} instead.{one_sided}",
                )
        for name in env_names:
            if name in OWNED_ENV:
                yield Hit(
                    f"{prefix}.env",
                    f"{name} is owned by the operator; use {OWNED_ENV[name]} instead.",
                )


def _invalid_choice(option: Option, args: tuple[str, ...], index: int) -> str | None:
    """The value given to an option with choices when it is not one of them (argparse checks
    the first value against `choices` and exits)."""
    if option.choices is None or not option.takes_value:
        return None
    _, eq, inline = args[index].partition("=")
    if eq:
        value: str | None = inline
    elif index + 1 < len(args) and not args[index + 1].startswith("--"):
        value = args[index + 1]
    else:
        value = None
    return value if value is not None and value not in option.choices else None


def _spellings(option: Option) -> set[str]:
    """Every name of an option, including the canonical one the ownership table uses."""
    return {*option.flags, "--" + option.dest.replace("_", "-")}


@rule(
    "DSV4-R018",
    "passthrough flag or value the release's parser does not accept",
    "error",
    reference=f"{NOTES}#supported-releases",
    reads=("engine.extraArgs", "<role>.overrides.extraArgs", "engine.sglangVersion"),
    ack=False,
)
def flag_unknown_to_release(ctx: RuleContext) -> Iterator[Hit]:
    parser, version = ctx.release.engine, ctx.release.version
    for prefix, args, _ in ctx.passthrough():
        for index, token in enumerate(args):
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
            else:
                invalid = _invalid_choice(resolution.options[0], args, index)
                if invalid is not None:
                    choices = ", ".join(resolution.options[0].choices or ())
                    yield Hit(
                        f"{prefix}.extraArgs",
                        f"{name} {invalid}: not a choice of SGLang {version} ({choices}), so its "
                        "parser would refuse to start.",
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
