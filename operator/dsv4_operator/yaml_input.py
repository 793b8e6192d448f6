"""YAML documents from a user's file, bounded: size, nesting depth and aliases.

PyYAML would otherwise expand an alias bomb ("billion laughs") into exponential work for
whatever walks the result, and recurse until RecursionError on deeply nested input. The
bounds are far above any real DSV4Deployment (the CRD's deepest field is under 15 levels).
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.events import AliasEvent

MAX_BYTES = 3 * 1024 * 1024  # the API server refuses larger request bodies
MAX_DEPTH = 64
MAX_ALIASES = 64


class InputError(ValueError):
    """The text is not YAML this tool reads; the message says why and where."""


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


def load_documents(text: str) -> list[Any]:
    """Every non-empty document of `text`; InputError when it is too large, too deep, holds
    too many aliases or is not YAML."""
    size = len(text.encode("utf-8"))
    if size > MAX_BYTES:
        raise InputError(f"{size} bytes; at most {MAX_BYTES} (the API server's request limit)")
    loader = _BoundedLoader(text)
    try:
        docs = []
        while loader.check_node():
            doc = loader.get_data()
            if doc is not None:
                docs.append(doc)
        return docs
    except yaml.YAMLError as error:
        raise InputError(f"not valid YAML: {error}") from error
    finally:
        loader.dispose()
