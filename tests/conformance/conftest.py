"""Conformance fixtures: each supported SGLang release as a parameter, and a way to ask its own
code; the cached CPU-only environment per release is release_env.py's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from .release_env import RELEASES, ask


@pytest.fixture(params=RELEASES)
def version(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def asker() -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    return ask
