"""Shared fixtures for the pure-core unit tests (the example spec and a way to vary it), and
the tier's one rule, enforced: a unit test starts no process and opens no network socket.

A test that starts a process, a server or a control plane, or listens on or connects to a
network address, is an integration test and lives in tests/integration. The audit hook below
refuses those operations while a unit test runs (setup, call and teardown), naming the test's
new home; Unix socket pairs (asyncio's own wake-up channel) and in-process transports
(httpx.MockTransport, aiohttp's mocked requests) stay allowed.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

# urllib3 (the Kubernetes client's) binds ::1 once, as it is imported, to learn whether the
# host has IPv6: imported before any test, so that the first test to import it (one run alone,
# or first on its worker) is not refused for a probe that is no network use.
import urllib3  # noqa: F401

from dsv4_operator.api.spec import DSV4DeploymentSpec
from tests.support.builders import Doc, example_doc, with_changes

_PROCESS_EVENTS = {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.system"}
_SOCKET_EVENTS = {"socket.bind", "socket.connect", "socket.sendto"}
_NETWORK_FAMILIES = {socket.AF_INET, socket.AF_INET6}


class UnitTierViolation(RuntimeError):
    """A unit test started a process or used the network: it belongs in tests/integration."""


class _Guard:
    active = False
    violations: list[str] = []  # noqa: RUF012 (one list for the process, by design)


def _refuse(message: str) -> None:
    _Guard.active = False  # pytest's own reporting must not trip over the check
    _Guard.violations.append(message)
    raise UnitTierViolation(message)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _Guard.active:
        return
    if event in _PROCESS_EVENTS or event.startswith("os.exec"):
        _refuse(
            f"a unit test started a process ({event} {args[:2]!r}); a test that starts "
            "processes is an integration test: move it to tests/integration"
        )
    elif event in _SOCKET_EVENTS and getattr(args[0], "family", None) in _NETWORK_FAMILIES:
        _refuse(
            f"a unit test used the network ({event} {args[1]!r}); a test with a listener or "
            "a connection is an integration test: move it to tests/integration, or give the "
            "code an in-process transport (httpx.MockTransport)"
        )


sys.addaudithook(_audit)


UNIT_TIER = Path(__file__).resolve().parent


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    # pytest calls this hook for every item of the run, in whichever tier it is.
    _Guard.active, _Guard.violations[:] = UNIT_TIER in item.path.parents, []
    try:
        return (yield)
    finally:
        _Guard.active = False


@pytest.fixture(autouse=True)
def _unit_tier_rule() -> Generator[None]:
    """Fails the test even when the code under test swallowed the refusal."""
    yield
    if _Guard.violations:
        pytest.fail(_Guard.violations[0], pytrace=False)


@pytest.fixture(name="example_doc")
def example_doc_fixture() -> Doc:
    return example_doc()


@pytest.fixture
def example_spec(example_doc: Doc) -> DSV4DeploymentSpec:
    return DSV4DeploymentSpec.model_validate(example_doc["spec"])


@pytest.fixture
def variant(example_doc: Doc) -> Callable[..., Doc]:
    """A copy of the example spec with `{"engine.indexKDtype": "bf16", ...}` applied."""

    def make(changes: dict[str, Any]) -> Doc:
        return with_changes(example_doc["spec"], changes)

    return make
