"""`dsv4 probe`: run the tool-calling canary against an endpoint and judge its leak rate.

Exit codes: dsv4_operator.exit_codes (CLEAN 0, LEAKING 1, bad input 2, INCONCLUSIVE 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TextIO
from urllib.parse import urlparse

import click
import httpx

from dsv4_operator.canary.harness import run_canary
from dsv4_operator.canary.report import CanaryReport, Per, ResponseRecord
from dsv4_operator.canary.transport import ProbeError, canary_limits, discover_model
from dsv4_operator.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_INCONCLUSIVE,
    EXIT_LEAKING,
    EXIT_OK,
    with_exit_codes,
)
from dsv4_operator.leak.stats import ProportionTest, compare_proportions, confidence_text
from dsv4_operator.leak.verdict import VerdictKind

Judgement = Literal["leaking", "clean", "inconclusive"]


def _fail(message: str) -> NoReturn:
    click.echo(f"dsv4 probe: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _check_url(url: str, option: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        _fail(f"{option} {url!r} is not an http(s) URL like http://host:8000")
    return url


@dataclass(frozen=True)
class Judged:
    """One probed endpoint and the verdict on its leak rate."""

    report: CanaryReport
    per: Per
    threshold: float

    @property
    def judgement(self) -> Judgement:
        _, _, _, (low, high) = self.report.rate(self.per)
        if low > self.threshold:
            return "leaking"
        return "clean" if high < self.threshold else "inconclusive"

    @property
    def significantly_above(self) -> bool:
        return self.judgement == "leaking"


def _exit_code(judged: list[Judged]) -> int:
    """LEAKING wins over INCONCLUSIVE, which wins over CLEAN: a CI job passes only on CLEAN."""
    judgements = {j.judgement for j in judged}
    if "leaking" in judgements:
        return EXIT_LEAKING
    return EXIT_INCONCLUSIVE if "inconclusive" in judgements else EXIT_OK


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}s"


def _summary(judged: Judged) -> str:
    report, per, threshold = judged.report, judged.per, judged.threshold
    conf = confidence_text(report.confidence)
    counts = ", ".join(f"{k.value} {report.counts[k]}" for k in VerdictKind)
    lines = [
        f"dsv4 probe: {report.base_url}  model {report.model}  {report.sessions} sessions x "
        f"{report.rounds} rounds, concurrency {report.concurrency}, seed {report.seed}"
        f"{', streaming' if report.stream else ''}, {report.duration_s:.1f}s",
        f"  responses  {report.responses} ({counts})",
    ]
    units: tuple[tuple[str, Per], ...] = (
        ("per session ", "sessions"),
        ("per response", "responses"),
    )
    for label, unit in units:
        leaks, trials, rate, (low, high) = report.rate(unit)
        mark = "  <- judged" if unit == per else ""
        lines.append(
            f"  leak rate  {label} {leaks}/{trials} = {_pct(rate)}  "
            f"{conf} CI [{_pct(low)}, {_pct(high)}]{mark}"
        )
    lines.append(
        f"  latency    p50 {_seconds(report.latency_p50)}  p95 {_seconds(report.latency_p95)}  "
        f"p99 {_seconds(report.latency_p99)}"
    )
    examples = report.examples
    if examples:
        lines.append("  examples of corrupted outputs:")
        lines += [_example(record) for record in examples]
    if report.errors:
        first = report.error_examples[0].verdict
        lines.append(f"  errors     {report.errors} (first: {first.reason} {first.snippet[:80]})")
    _, _, _, (low, high) = report.rate(per)
    per_unit = "per-session" if per == "sessions" else "per-response"
    if judged.judgement == "leaking":
        verdict = (
            f"LEAKING: the {per_unit} leak rate is significantly above {_pct(threshold)} "
            f"(lower bound {_pct(low)} > {_pct(threshold)} at {conf} confidence)"
        )
    elif judged.judgement == "clean":
        verdict = (
            f"CLEAN: the {per_unit} leak rate is significantly below {_pct(threshold)} "
            f"(upper bound {_pct(high)} < {_pct(threshold)} at {conf} confidence)"
        )
    else:
        verdict = (
            f"INCONCLUSIVE: not significantly above {_pct(threshold)} "
            f"(lower bound {_pct(low)}), nor below it (upper bound {_pct(high)}); "
            "more sessions would tell"
        )
    lines.append(f"  verdict    {verdict}")
    return "\n".join(lines)


def _example(record: ResponseRecord) -> str:
    snippet = json.dumps(record.verdict.snippet[:120], ensure_ascii=False)
    return (
        f"    session {record.session} round {record.round}  {record.verdict.kind.value}: "
        f"{record.verdict.reason}\n      {snippet}"
    )


def _comparison_text(test: ProportionTest, a: CanaryReport, b: CanaryReport, per: Per) -> str:
    verdict = "significant" if test.significant else "not significant"
    return (
        f"comparison ({per}): {a.base_url} {test.k1}/{test.n1} = {_pct(test.rate1)} vs "
        f"{b.base_url} {test.k2}/{test.n2} = {_pct(test.rate2)}; difference "
        f"{100 * test.difference:+.1f} points, Fisher's exact p = {test.p_value:.3g}: {verdict} "
        f"at alpha {test.alpha:g}"
    )


async def _run_one(
    client: httpx.AsyncClient,
    url: str,
    *,
    model: str | None,
    sessions: int,
    rounds: int,
    concurrency: int | None,
    timeout: float,
    seed: int,
    stream: bool,
    confidence: float,
    progress: bool,
    stderr: TextIO,
) -> CanaryReport:
    if model is None:
        model = await discover_model(client, url, timeout=min(timeout, 10.0))
    with contextlib.ExitStack() as stack:
        bar = (
            stack.enter_context(
                click.progressbar(length=sessions * rounds, label=f"probing {url}", file=stderr)
            )
            if progress
            else None
        )

        def advance(record: ResponseRecord) -> None:
            skipped = 0
            if record.verdict.kind is not VerdictKind.OK:
                skipped = rounds - record.round  # the session ends here
            if bar is not None:
                bar.update(1 + skipped)

        return await run_canary(
            client,
            url,
            model,
            sessions,
            rounds,
            concurrency,
            timeout,
            seed,
            stream=stream,
            confidence=confidence,
            on_response=advance,
        )


async def _run_all(urls: list[str], **options: Any) -> list[CanaryReport]:
    concurrency = options["concurrency"] or options["sessions"]
    async with httpx.AsyncClient(limits=canary_limits(concurrency)) as client:
        return [await _run_one(client, url, **options) for url in urls]


@click.command(
    "probe",
    help=with_exit_codes(
        "probe",
        "Multi-turn tool-calling canary: N sessions x R rounds, every response classified. "
        "With --vs, both endpoints are judged and the worst decides.",
    ),
)
@click.option("--url", required=True, help="OpenAI-compatible server root (or its /v1).")
@click.option("--sessions", type=click.IntRange(min=1), default=60, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--threshold",
    type=click.FloatRange(0, 1, max_open=True),
    default=0.02,
    show_default=True,
    help="Leak rate that must not be significantly exceeded.",
)
@click.option(
    "--confidence",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.99,
    show_default=True,
    help="Confidence of the Wilson interval (and 1 - alpha of the --vs test).",
)
@click.option("--model", default=None, help="Model name (default: the first of /v1/models).")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Requests in flight at most (default: one per session).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Seconds per request.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Prompt seed.")
@click.option("--stream/--no-stream", default=False, show_default=True, help="Use SSE.")
@click.option(
    "--per",
    type=click.Choice(["sessions", "responses"]),
    default="sessions",
    show_default=True,
    help="Unit of the judged leak rate: sessions (independent) or responses.",
)
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--vs",
    "vs_url",
    default=None,
    help="Second endpoint: same prompts and seed; reports whether the rates differ.",
)
def probe_command(
    url: str,
    sessions: int,
    rounds: int,
    threshold: float,
    confidence: float,
    model: str | None,
    concurrency: int | None,
    timeout: float,
    seed: int,
    stream: bool,
    per: Per,
    output: str,
    vs_url: str | None,
) -> None:
    urls = [_check_url(url, "--url")]
    if vs_url is not None:
        urls.append(_check_url(vs_url, "--vs"))
    try:
        reports = asyncio.run(
            _run_all(
                urls,
                model=model,
                sessions=sessions,
                rounds=rounds,
                concurrency=concurrency,
                timeout=timeout,
                seed=seed,
                stream=stream,
                confidence=confidence,
                progress=output == "text",
                stderr=sys.stderr,
            )
        )
    except ProbeError as error:
        _fail(str(error))
    for report in reports:
        if report.classified == 0:
            first = report.error_examples[0].verdict if report.error_examples else None
            detail = f" (first: {first.reason} {first.snippet[:120]})" if first else ""
            _fail(
                f"no response from {report.base_url} could be classified: "
                f"{report.errors} errors{detail}"
            )
    judged = [Judged(r, per, threshold) for r in reports]
    comparison: ProportionTest | None = None
    if len(reports) == 2:
        k1, n1, _, _ = reports[0].rate(per)
        k2, n2, _, _ = reports[1].rate(per)
        comparison = compare_proportions(k1, n1, k2, n2, confidence=confidence)
    code = _exit_code(judged)
    if output == "json":
        payload = {
            "threshold": threshold,
            "confidence": confidence,
            "per": per,
            "exitCode": code,
            "results": [
                {
                    **j.report.as_dict(),
                    "judgement": j.judgement,
                    "significantlyAbove": j.significantly_above,
                }
                for j in judged
            ],
            "comparison": comparison.as_dict() if comparison else None,
        }
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        click.echo("\n\n".join(_summary(j) for j in judged))
        if comparison is not None:
            click.echo("\n" + _comparison_text(comparison, reports[0], reports[1], per))
    sys.exit(code)
