"""YAML documents from a user's file, bounded: size, nesting depth, aliases, characters, integers.

PyYAML would otherwise expand an alias bomb ("billion laughs") into exponential work for
whatever walks the result, and recurse until RecursionError on deeply nested input. The
bounds are far above any real DSV4Deployment (the CRD's deepest field is under 15 levels).
Every refusal is an InputError that names the line: a control character PyYAML's reader
refuses, or an integer too long for Python to convert to and from text (CPython refuses
more than 4,300 decimal digits, a guard against quadratic-time conversion).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import ScalarNode

MAX_BYTES = 3 * 1024 * 1024  # the API server refuses larger request bodies
MAX_DEPTH = 64
MAX_ALIASES = 64
# CPython's own limit (sys.get_int_max_str_digits; 4300 unless changed): beyond it an
# integer can be neither parsed from decimal text nor printed, so one cannot be used at all.
MAX_INTEGER_DIGITS = sys.get_int_max_str_digits() or 4300


class InputError(ValueError):
    """The text is not YAML this tool reads; the message says why and where."""


def _position(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def _integer_too_long(value: int) -> bool:
    # 10**digits > 2**(3.3219 * digits): a bit length beyond this has more digits than allowed
    return value.bit_length() > MAX_INTEGER_DIGITS * 3.3219


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def _line(self) -> int:
        return int(self.get_mark().line) + 1

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise InputError(
                    f"more than {MAX_ALIASES} YAML aliases (line {self._line()}); expand them"
                )
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise InputError(f"nested deeper than {MAX_DEPTH} levels (line {self._line()})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_bounded_int(self, node: ScalarNode) -> int:
        """An integer as SafeLoader reads it (decimal, 0x, 0o, 0b, sexagesimal), or InputError
        when it has more digits than Python converts (decimal text refuses to parse; a hex
        one parses but could never be printed in a message)."""
        line = node.start_mark.line + 1
        try:
            value: int = super().construct_yaml_int(node)
        except ValueError:
            value = 0  # the decimal conversion refused it: too many digits
            too_long = True
        else:
            too_long = _integer_too_long(value)
        if too_long:
            raise InputError(
                f"line {line}: an integer of more than {MAX_INTEGER_DIGITS} digits; no field "
                "of a DSV4Deployment takes one (replicas, ports and sizes fit in 64 bits)"
            )
        return value


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_bounded_int)


def load_documents(text: str) -> list[Any]:
    """Every non-empty document of `text`; InputError when it is too large, too deep, holds
    too many aliases, a character YAML refuses or an integer too long to use, or is not YAML."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_BYTES:
        raise InputError(f"{size} bytes; at most {MAX_BYTES} (the API server's request limit)")
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # its reader refuses control characters here
        docs = []
        while loader.check_node():
            doc = loader.get_data()
            if doc is not None:
                docs.append(doc)
        return docs
    except yaml.reader.ReaderError as error:
        raise InputError(
            f"character U+{error.character:04X} at {_position(text, error.position)} is a "
            "control character YAML does not allow; remove it (or write it escaped, as "
            '"\\x07", inside double quotes)'
        ) from error
    except yaml.YAMLError as error:
        raise InputError(f"not valid YAML: {error}") from error
    finally:
        if loader is not None:
            loader.dispose()
