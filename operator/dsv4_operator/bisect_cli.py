"""`dsv4 bisect`: the configuration delta between two DSV4Deployments, the probe plan, and the
same search the operator runs, against engines the user starts itself (`--url-for CMD`).

The search, the units and the outcome rule are bisect/ (shared with the operator); this module
only reads the two files, runs CMD and the canary per probe, and prints.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

import click
import httpx
import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.bisect import search
from dsv4_operator.bisect.delta import Delta, compute_delta
from dsv4_operator.bisect.outcome import DEFAULT_MAX_RESPONSES, Outcome, ProbeEvidence, ProbeJudge
from dsv4_operator.bisect.outcome import judge as judge_outcome
from dsv4_operator.bisect.report import answer_text, plan_text, probe_text, units_text
from dsv4_operator.bisect.search import BisectState, ProbeRequest, Reason
from dsv4_operator.canary.harness import run_canary
from dsv4_operator.canary.transport import ProbeError, canary_limits
from dsv4_operator.engine.canary_load import canary_load
from dsv4_operator.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_INCONCLUSIVE,
    EXIT_NOT_REPRODUCED,
    EXIT_OK,
    with_exit_codes,
)
from dsv4_operator.names import API_VERSION, KIND
from dsv4_operator.settings import OperatorSettings
from dsv4_operator.yaml_input import InputError, load_documents

DEFAULT_BUDGET = 40
EXIT_BY_REASON = {
    Reason.FOUND: EXIT_OK,
    Reason.NO_DELTA: EXIT_NOT_REPRODUCED,
    Reason.NOT_REPRODUCED: EXIT_NOT_REPRODUCED,
    Reason.BUDGET_EXHAUSTED: EXIT_INCONCLUSIVE,
    Reason.INCONCLUSIVE: EXIT_INCONCLUSIVE,
}


def _fail(message: str) -> NoReturn:
    click.echo(f"dsv4 bisect: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _deployment(path: str, option: str) -> dict[str, Any]:
    """The one DSV4Deployment in a file (exit 2 naming the option otherwise)."""
    try:
        docs = load_documents(Path(path).read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        _fail(f"{option} {path}: cannot read it: {error}")
    except InputError as error:
        _fail(f"{option} {path}: {error}")
    found = [
        d
        for d in docs
        if isinstance(d, dict) and d.get("apiVersion") == API_VERSION and d.get("kind") == KIND
    ]
    if len(found) != 1 or not isinstance(found[0].get("spec"), dict):
        _fail(f"{option} {path}: expected exactly one {API_VERSION} {KIND} with a spec")
    return found[0]


@dataclass(frozen=True)
class Runner:
    """How each probe runs: the probe spec file, CMD for its URL, the canary, the judge."""

    delta: Delta
    url_for: list[str]
    workdir: Path
    name: str
    judge: ProbeJudge
    timeout: float
    seed: int

    def write_spec(self, request: ProbeRequest) -> Path:
        doc = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": f"{self.name}-bisect-{request.probe_id}"},
            "spec": self.delta.spec_for(request.units),
        }
        path = self.workdir / f"{request.probe_id}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), "utf-8")
        return path

    async def url(self, spec_file: Path) -> str:
        """What CMD prints last on stdout for this probe spec (ProbeError when it fails)."""
        process = await asyncio.create_subprocess_exec(
            *self.url_for,
            str(spec_file),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        if process.returncode != 0:
            tail = err.decode(errors="replace").strip()[-300:]
            raise ProbeError(f"--url-for exited {process.returncode}: {tail}")
        lines = [line.strip() for line in out.decode(errors="replace").splitlines()]
        url = next((line for line in reversed(lines) if line), "")
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ProbeError(f"--url-for printed {url!r}, not an http(s) base URL")
        return url

    async def run(self, request: ProbeRequest) -> tuple[Outcome, ProbeEvidence]:
        """Canary the probe's engines at production concurrency until the test decides."""
        spec_file = self.write_spec(request)
        spec = DSV4DeploymentSpec.model_validate(self.delta.spec_for(request.units))
        sessions, rounds = canary_load(spec).sessions, spec.guard.canary.rounds
        leaks = responses = 0
        # Each probe its own conversations: a confirmation is a fresh sample, not a replay.
        probe_seed = self.seed + zlib.crc32(request.probe_id.encode())
        try:
            url = await self.url(spec_file)
            async with httpx.AsyncClient(limits=canary_limits(sessions)) as client:
                for batch in range(self.judge.max_responses):
                    report = await run_canary(
                        client, url, None, sessions, rounds, timeout=self.timeout,
                        seed=probe_seed + batch,
                    )  # fmt: skip
                    if report.classified == 0:
                        raise ProbeError(f"no response from {url} could be classified")
                    leaks, responses = leaks + report.leaks, responses + report.classified
                    outcome, evidence = judge_outcome(leaks, responses, self.judge)
                    if outcome is not None:
                        return outcome, evidence
        except ProbeError as error:
            _, evidence = judge_outcome(leaks, responses, self.judge)
            detail = f"{error} (skipped like an inconclusive probe)"
            return Outcome.INCONCLUSIVE, evidence.model_copy(update={"detail": detail})
        raise AssertionError("the response budget ends the loop")  # pragma: no cover


async def _search(
    runner: Runner, budget: int, parallel: int, control: bool, to_stderr: bool
) -> BisectState:
    """Run the search to its answer, printing each probe as it ends (on stderr for JSON)."""
    state = search.start(runner.delta.unit_ids, budget, control)
    shown: set[str] = set()
    while search.answer(state) is None:
        state, requests = search.next_probes(state, parallel, runner.delta.refusal)
        for probe in state.probes:
            if probe.status is search.ProbeStatus.REFUSED and probe.probe_id not in shown:
                shown.add(probe.probe_id)
                click.echo(probe_text(runner.delta, probe), err=to_stderr)
        if not requests:
            continue
        results = await asyncio.gather(*(runner.run(r) for r in requests))
        for request, (outcome, evidence) in zip(requests, results, strict=True):
            state = search.record(state, request.probe_id, outcome, evidence)
            shown.add(request.probe_id)
            record = next(p for p in state.probes if p.probe_id == request.probe_id)
            click.echo(probe_text(runner.delta, record), err=to_stderr)
    return state


@click.command(
    "bisect",
    help=with_exit_codes(
        "bisect",
        "The settings between a last known good and a rejected DSV4Deployment, and a delta "
        "debugging (ddmin) search for the culprit. Without --url-for a dry run: the units and "
        "the probe plan. With --url-for CMD, each probe's spec is written to a file, CMD is "
        "run with its path and prints the base URL of engines it started for that spec, and "
        "the canary runs there at the spec's production concurrency until the anytime-valid "
        "test decides (docs/bisect.md).",
    ),
)
@click.option("--good", "good_path", required=True, help="The last known good DSV4Deployment.")
@click.option("--bad", "bad_path", required=True, help="The rejected DSV4Deployment.")
@click.option(
    "--url-for",
    default=None,
    help="Command run per probe with the probe's spec file as its last argument; its last "
    "line of output is the base URL to canary.",
)
@click.option(
    "--budget",
    type=click.IntRange(1, 1000),
    default=DEFAULT_BUDGET,
    show_default=True,
    help="The most probes started (refused ones are never started).",
)
@click.option(
    "--parallel", type=click.IntRange(1, 64), default=1, show_default=True, help="Probes at once."
)
@click.option(
    "--max-responses",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_RESPONSES,
    show_default=True,
    help="Responses a probe may take before it is inconclusive.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds per canary request.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Canary prompt seed (each probe adds its own, so no two probes replay one sample).",
)
@click.option("--workdir", default=None, help="Where probe spec files go (default: a temp dir).")
@click.option(
    "--control/--no-control",
    default=True,
    show_default=True,
    help="Also probe the good spec itself beside the reproduction: if it fails too, the leak "
    "is not the delta's (engines that leak as they start, the environment) and nothing is "
    "blamed.",
)
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def bisect_command(
    good_path: str,
    bad_path: str,
    url_for: str | None,
    budget: int,
    parallel: int,
    max_responses: int,
    timeout: float,
    seed: int,
    workdir: str | None,
    control: bool,
    output: str,
) -> None:
    good, bad = _deployment(good_path, "--good"), _deployment(bad_path, "--bad")
    try:
        delta = compute_delta(good["spec"], bad["spec"], OperatorSettings().trust_policy)
        bad_spec = DSV4DeploymentSpec.model_validate(bad["spec"])
    except ValueError as error:
        _fail(str(error))
    judge = ProbeJudge.from_guard(bad_spec.guard, max_responses)
    first = search.preview(delta.unit_ids, parallel, delta.refusal, control)
    if url_for is None:
        if output == "json":
            click.echo(json.dumps(_payload(delta, first, None, control), indent=2))
        else:
            click.echo(units_text(delta))
            if delta.units:
                click.echo(plan_text(delta, first, parallel, control))
        sys.exit(EXIT_OK)
    command = shlex.split(url_for)
    if not command:
        _fail("--url-for is empty")
    where = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="dsv4-bisect-"))
    where.mkdir(parents=True, exist_ok=True)
    name = str((bad.get("metadata") or {}).get("name") or "dsv4")
    runner = Runner(delta, command, where, name, judge, timeout, seed)
    if output == "text":
        click.echo(units_text(delta))
        click.echo(f"probe specs in {where}")
    state = asyncio.run(_search(runner, budget, parallel, control, to_stderr=output == "json"))
    found = search.answer(state)
    assert found is not None
    if output == "json":
        click.echo(json.dumps(_payload(delta, first, state, control), indent=2))
    else:
        click.echo(answer_text(delta, found))
    sys.exit(EXIT_BY_REASON[found.reason])


def _payload(
    delta: Delta, first: list[ProbeRequest], state: BisectState | None, control: bool
) -> dict[str, Any]:
    """`-o json` (docs/schemas/bisect.schema.json): the units and the plan; after a search,
    its whole state and the answer."""
    return {
        "units": [u.model_dump(mode="json") for u in delta.units],
        "firstProbes": [p.model_dump(mode="json") for p in first],
        "worstCaseProbes": search.worst_case_probes(len(delta.units)) + control,
        "search": state.model_dump(mode="json") if state is not None else None,
        "answer": state.answer.model_dump(mode="json") if state and state.answer else None,
    }
