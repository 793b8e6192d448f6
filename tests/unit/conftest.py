"""Shared fixtures for the pure-core unit tests: the example spec and a way to vary it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "dsv4.yaml"

Doc = dict[str, Any]


@pytest.fixture
def example_doc() -> Doc:
    doc: Doc = yaml.safe_load(EXAMPLE.read_text())
    return doc


@pytest.fixture
def example_spec(example_doc: Doc) -> DSV4DeploymentSpec:
    return DSV4DeploymentSpec.model_validate(example_doc["spec"])


def set_path(doc: Doc, dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested dict, creating mappings on the way."""
    *parents, last = dotted.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


@pytest.fixture
def variant(example_doc: Doc) -> Callable[..., Doc]:
    """A copy of the example spec with `{"engine.indexKDtype": "bf16", ...}` applied."""

    def make(changes: dict[str, Any]) -> Doc:
        spec = copy.deepcopy(example_doc["spec"])
        for dotted, value in changes.items():
            set_path(spec, dotted, value)
        return spec

    return make
