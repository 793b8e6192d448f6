"""What a corrupted model generated: the text a release's tool-call parser reads (parsers.py).

The incident was seen only through 0.5.16's answers (shapes.py); what the model generated to get
them is this double's assumption, chosen so that 0.5.16's own detector returns those answers.
Each release then answers the same output its own way, and tests/conformance/
test_engine_double.py feeds every output through each release's wheel to check that the double
answers as it does.

An `Output` is DSML kept as parts (prose, a section, its invokes and their parameters, where the
text ends) so that a parser's answer can be read off the parts; `render()` is the text itself.
A fault draws an output kind from its table (`HICACHE_OUTPUTS`, `MULTI_STREAM_OUTPUTS`); the
`DSV4_DOUBLE_SILENT_DROP_SHARE` knob replaces that share of them with `SILENT_DROPS`, the
outputs deepseek-recipe (0.5.23) reads no call from. Pure: `random.Random` instances carry the
draws.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dsv4_engine_double import shapes
from dsv4_engine_double.config import (
    CONFIGURED_LEAK,
    EARLY_NOISE,
    HICACHE_RACE,
    MULTI_STREAM_ALIASING,
)
from dsv4_engine_double.shapes import EOS, FW, Call, Tools


class Generated(StrEnum):
    """A kind of corrupted model output."""

    BROKEN_JSON_BODY = "broken_json_body"  # an invoke whose body is direct JSON that won't parse
    BARE_INVOKE = "bare_invoke"  # an invoke with no section around it
    V32_SECTION = "v32_section"  # the V3.2 block name `function_calls`
    UNCLOSED_SECTION = "unclosed_section"  # a whole invoke, then the end: no section close
    CUT_IN_VALUE = "cut_in_value"  # the output ends inside a parameter's value
    STRIPPED_DSML = "stripped_dsml"  # tool-call tags without the DSML token
    TAG_SOUP = "tag_soup"  # closing tags and attributes, a stray DSML parameter at the end
    ATTRIBUTE_SOUP = "attribute_soup"
    REPETITION = "repetition"
    GARBLED = "garbled"
    PROSE_ONLY = "prose_only"
    EOS_IN_PROSE = "eos_in_prose"  # an end-of-sentence token in the prose, then a clean call
    LOOPED_ARGUMENT = "looped_argument"  # a clean call whose string argument loops
    UNKNOWN_TOOL = "unknown_tool"  # a clean call to a tool the request did not offer
    SCHEMA_VIOLATION = "schema_violation"
    REPEATED_CALLS = "repeated_calls"  # the same invoke four times
    # SILENT_DROPS: outputs deepseek-recipe reads no call from
    OPEN_SECTION = "open_section"  # `<｜DSML｜tool_calls>`, then the end: no invoke
    NAMELESS_SECTION = "nameless_section"  # a closed section whose one invoke has no name
    NAMELESS_INVOKE = "nameless_invoke"  # `<｜DSML｜invoke` with no name, no section, at the end


SILENT_DROPS = (Generated.OPEN_SECTION, Generated.NAMELESS_SECTION, Generated.NAMELESS_INVOKE)
# Which outputs each seed fault produces, with weights.
HICACHE_OUTPUTS: dict[Generated, int] = {
    Generated.BROKEN_JSON_BODY: 4,
    Generated.BARE_INVOKE: 2,
    Generated.V32_SECTION: 1,
    Generated.UNCLOSED_SECTION: 2,
    Generated.STRIPPED_DSML: 1,
    Generated.TAG_SOUP: 2,
    Generated.REPETITION: 1,
    Generated.GARBLED: 1,
    Generated.CUT_IN_VALUE: 1,
    Generated.EOS_IN_PROSE: 1,
}
MULTI_STREAM_OUTPUTS: dict[Generated, int] = {
    Generated.REPETITION: 3,
    Generated.TAG_SOUP: 2,
    Generated.ATTRIBUTE_SOUP: 1,
    Generated.LOOPED_ARGUMENT: 1,
    Generated.UNKNOWN_TOOL: 1,
    Generated.SCHEMA_VIOLATION: 1,
    Generated.BROKEN_JSON_BODY: 1,
    Generated.REPEATED_CALLS: 1,
    Generated.PROSE_ONLY: 1,
}
# The knobs' faults (a configured culprit, early noise) leak as the incident's race did.
FAULT_OUTPUTS = {
    HICACHE_RACE: HICACHE_OUTPUTS,
    MULTI_STREAM_ALIASING: MULTI_STREAM_OUTPUTS,
    CONFIGURED_LEAK: HICACHE_OUTPUTS,
    EARLY_NOISE: HICACHE_OUTPUTS,
}


@dataclass(frozen=True)
class Param:
    """`<｜DSML｜parameter name=... string=...>raw</｜DSML｜parameter>`."""

    name: str
    raw: str  # the text between the tags: the value, or JSON when not `string`
    string: bool

    def render(self, cut: int | None = None) -> str:
        flag = "true" if self.string else "false"
        head = f'<{FW}parameter name="{self.name}" string="{flag}">'
        if cut is not None:
            return head + self.raw[:cut]
        return f"{head}{self.raw}</{FW}parameter>"


@dataclass(frozen=True)
class Invoke:
    """One `<｜DSML｜invoke>`; `closed` False: the output ends in it (inside the last
    parameter's value after `cut` characters, when `cut` is set)."""

    name: str | None  # None: an invoke tag without a name
    params: tuple[Param, ...] = ()
    body: str | None = None  # direct JSON instead of parameter tags
    closed: bool = True
    cut: int | None = None

    def render(self) -> str:
        if self.name is None and not self.closed:
            return f"<{FW}invoke"
        opening = f"<{FW}invoke>" if self.name is None else f'<{FW}invoke name="{self.name}">'
        lines = [opening] if self.body is None else [opening, self.body]
        for index, param in enumerate(self.params):
            last = index == len(self.params) - 1
            lines.append(param.render(self.cut if last else None))
        if self.closed:
            lines.append(f"</{FW}invoke>")
        return "\n".join(lines)


@dataclass(frozen=True)
class Output:
    """What the model generated: `text` alone (plus a `stray` DSML fragment after it), or prose
    and DSML: a section named `block` (None: bare invokes) holding `invokes`."""

    kind: Generated
    prose: str = ""
    block: str | None = "tool_calls"
    invokes: tuple[Invoke, ...] = ()
    section_closed: bool = True
    text: str | None = None
    stray: str = ""
    finish: str = "stop"  # why generation ended: "stop" (a stop token) or "length"

    def render(self) -> str:
        if self.text is not None:
            return self.text + (f"\n{self.stray}" if self.stray else "")
        parts = [f"<{FW}{self.block}>"] if self.block is not None else []
        for invoke in self.invokes:
            parts.append(invoke.render())
            if not invoke.closed:
                break  # the output ends inside it
        dsml = "\n".join(parts)
        if self.block is not None and all(invoke.closed for invoke in self.invokes):
            # the section's end, or the line break the model wrote before it stopped
            dsml += f"\n</{FW}{self.block}>" if self.section_closed else "\n"
        return f"{self.prose}\n\n{dsml}" if self.prose else dsml


def params_of(args: Mapping[str, Any]) -> tuple[Param, ...]:
    """Parameters as the model writes them: strings as they are, anything else as JSON."""
    return tuple(
        Param(key, value, True)
        if isinstance(value, str)
        else Param(key, json.dumps(value, ensure_ascii=False), False)
        for key, value in args.items()
    )


def draw(
    weights: Mapping[Generated, int], silent_drop_share: float, rng: random.Random
) -> Generated:
    """An output kind of a fault's table, or (a `silent_drop_share` of the time) a silent drop."""
    if rng.random() < silent_drop_share:
        return rng.choice(SILENT_DROPS)
    kinds = list(weights)
    return rng.choices(kinds, weights=[weights[k] for k in kinds])[0]


def generate(kind: Generated, tools: Tools, call: Call, rng: random.Random) -> Output:
    """The output of `kind` the model generated when it meant to make `call`."""
    name, args = call
    params = params_of(args)
    clean = Invoke(name, params)
    preamble = rng.choice(shapes.PREAMBLES)
    builders: dict[Generated, Callable[[], Output]] = {
        # `{,` can never be JSON: 0.5.16's detector raises on it, recipe skips it
        Generated.BROKEN_JSON_BODY: lambda: Output(
            kind, invokes=(Invoke(name, body="{," + json.dumps(args, ensure_ascii=False)[1:]),)
        ),
        Generated.BARE_INVOKE: lambda: Output(kind, block=None, invokes=(clean,)),
        Generated.V32_SECTION: lambda: Output(kind, block="function_calls", invokes=(clean,)),
        Generated.UNCLOSED_SECTION: lambda: Output(
            kind, prose=preamble, invokes=(clean,), section_closed=False
        ),
        Generated.CUT_IN_VALUE: lambda: _cut(kind, preamble, name, params, rng),
        Generated.STRIPPED_DSML: lambda: Output(kind, text=shapes.dsml_block([call], bar="")),
        Generated.TAG_SOUP: lambda: Output(
            kind,
            text='</invoke></invoke> string="false">false">1' * rng.randint(1, 4),
            stray=f'<{FW}parameter name="{next(iter(args), "x")}" string="false">false">1',
            finish="length",
        ),
        Generated.ATTRIBUTE_SOUP: lambda: Output(
            kind, text=shapes.attribute_soup(args), finish="length"
        ),
        Generated.REPETITION: lambda: Output(
            kind,
            text=shapes.loop_text(
                f"I need to call {name} for {json.dumps(args)[:40]} first. ", rng
            ),
            finish="length",
        ),
        Generated.GARBLED: lambda: Output(kind, text=shapes.garbled_text(rng), finish="length"),
        Generated.PROSE_ONLY: lambda: Output(kind, text=rng.choice(shapes.PROSE)),
        Generated.EOS_IN_PROSE: lambda: Output(
            kind, prose=f"Let me check that.{EOS}", invokes=(clean,)
        ),
        Generated.LOOPED_ARGUMENT: lambda: Output(
            kind,
            invokes=(
                Invoke(
                    name,
                    params_of(
                        {
                            **args,
                            shapes.string_key(tools, name): shapes.loop_text(
                                "the the weather ", rng, 300
                            ),
                        }
                    ),
                ),
            ),
        ),
        Generated.UNKNOWN_TOOL: lambda: Output(
            kind, invokes=(Invoke(shapes.unknown_name(tools, name, rng), params),)
        ),
        Generated.SCHEMA_VIOLATION: lambda: _schema_violation(kind, preamble, tools, call, rng),
        Generated.REPEATED_CALLS: lambda: Output(kind, invokes=(clean,) * 4),
        Generated.OPEN_SECTION: lambda: Output(kind, prose=preamble, section_closed=False),
        Generated.NAMELESS_SECTION: lambda: Output(
            kind, prose=preamble, invokes=(Invoke(None, params),)
        ),
        Generated.NAMELESS_INVOKE: lambda: Output(
            kind, prose=preamble, block=None, invokes=(Invoke(None, closed=False),)
        ),
    }
    return builders[kind]()


def _cut(
    kind: Generated, prose: str, name: str, params: tuple[Param, ...], rng: random.Random
) -> Output:
    """The output ends inside one parameter's value (or, with none, right after the invoke
    tag): generation stopped in the middle of the call."""
    if not params:
        return Output(
            kind, prose=prose, invokes=(Invoke(name, closed=False),), section_closed=False
        )
    last = rng.randrange(len(params))
    value = params[last].raw
    cut = rng.randint(1, max(1, len(value) - 1))
    invoke = Invoke(name, params[: last + 1], closed=False, cut=cut)
    return Output(kind, prose=prose, invokes=(invoke,), section_closed=False)


def _schema_violation(
    kind: Generated, prose: str, tools: Tools, call: Call, rng: random.Random
) -> Output:
    name, args = call
    broken = shapes.violating_args(shapes.tool_schema(tools, name), args)
    if broken is None:  # nothing in the schema to violate: the call is cut off instead
        return _cut(kind, prose, name, params_of(args), rng)
    return Output(kind, invokes=(Invoke(name, params_of(broken)),))
