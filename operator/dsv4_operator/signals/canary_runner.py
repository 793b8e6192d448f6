"""The guard's canary runner (I/O): one canary run against a deployment's endpoint, as counts."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.canary.remote import RunCounts, RunRequest, run_on_tap
from dsv4_operator.engine.canary_load import canary_load
from dsv4_operator.names import router_url

if TYPE_CHECKING:  # the harness is imported on the first run (it brings the classifier)
    from dsv4_operator.canary.remote import Poster
    from dsv4_operator.canary.transport import Exchanges


# What one canary run saw, run here or by a tap: one type for both (canary/remote.py).
CanaryRun = RunCounts

# (endpoint, served model, spec) -> one canary run
CanaryRunner = Callable[[str, str, DSV4DeploymentSpec], Awaitable[CanaryRun]]


def default_endpoint(name: str, namespace: str, spec: DSV4DeploymentSpec) -> str:
    return router_url(name, namespace, spec.router.port)


def probe_runner(client: Exchanges) -> CanaryRunner:
    """The real canary, on `client` (the operator's shared one, signals/http.py: no client and
    no TLS context per run): multi-turn tool-calling sessions classified by the DSML detector."""

    async def run(endpoint: str, model: str, spec: DSV4DeploymentSpec) -> CanaryRun:
        from dsv4_operator.canary.harness import run_canary

        canary = spec.guard.canary
        # A new seed each run: fresh prompts, so runs are independent samples.
        report = await run_canary(
            client,
            endpoint,
            model=model,
            sessions=canary_load(spec).sessions,  # what status.guard.canarySessions says
            rounds=canary.rounds,
            seed=random.randrange(1 << 30),
        )
        return RunCounts.of(report)

    return run


def tap_canary_runner(client: Poster) -> CanaryRunner:
    """The canary run by a router pod's leak tap against the router beside it
    (canary/remote.py): one request of the operator's per run instead of every session's.
    Called with the tap's `http://pod-ip:port` where the operator's runner takes the endpoint;
    raises TapCanaryUnavailable when the tap did not run it (the caller then runs it itself)."""

    async def run(tap: str, model: str, spec: DSV4DeploymentSpec) -> CanaryRun:

        asked = RunRequest(
            model=model, sessions=canary_load(spec).sessions, rounds=spec.guard.canary.rounds
        )
        return await run_on_tap(client, tap, asked)

    return run


def runs_on_tap(spec: DSV4DeploymentSpec) -> bool:
    """Whether a router pod's tap can run this spec's canary: it probes the router (no
    canary.endpoint), and the router pods carry the tap (on, read at the pods, not at
    tap.metricsEndpoints)."""
    guard = spec.guard
    return guard.canary.endpoint is None and guard.tap.enabled and not guard.tap.metrics_endpoints
