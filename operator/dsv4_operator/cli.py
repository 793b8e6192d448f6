"""The `dsv4` command line: validate, plan, render, crd, rules, probe, bisect, selftest (a contract
other tools call).

`validate`, `plan` and `dsv4 --help` start in about half a second: the commands that talk to a
cluster or an engine (`probe`, `bisect`, `selftest`, `run`, `tap`) import the Kubernetes client,
httpx and the rest only when they run (`_LazyGroup`), and `tests/integration/test_cli_imports.py`
holds them to it.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
import yaml
from pydantic import ValidationError

from dsv4_operator.api.status import Finding
from dsv4_operator.engine.planner import GIB, MemoryPlan, RolePlan
from dsv4_operator.engine.releases import versions_text
from dsv4_operator.engine.rules import CATALOGUE
from dsv4_operator.engine.validation import NotADeployment, Validation, validate_object
from dsv4_operator.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_FINDINGS,
    EXIT_OK,
    USAGE_ERROR,
    with_exit_codes,
)
from dsv4_operator.names import KIND, MODEL_KIND
from dsv4_operator.settings import OperatorSettings
from dsv4_operator.yaml_input import InputError, load_documents

__all__ = ["EXIT_CODES", "main"]  # EXIT_CODES: the contract docs/cli.md is generated from

INPUT_RULE = "input"  # the finding of a document that is not a DSV4Deployment


@dataclass
class Document:
    """One YAML document of an input file, validated (or why it is not a DSV4Deployment)."""

    index: int  # 1-based, as a user counts them
    name: str
    namespace: str
    validation: Validation
    foreign: str | None = None  # set when the document is not a DSV4Deployment at all

    @property
    def valid(self) -> bool:
        return self.foreign is None and self.validation.valid


def _fail(message: str, output: str = "text") -> NoReturn:
    """Exit 2 with `message` on stderr and, when JSON was asked for, `{"error": {"message"}}`
    on stdout (a caller parsing stdout gets JSON whatever the input held)."""
    click.echo(f"dsv4: {message}", err=True)
    if output == "json":
        _echo_json({"error": {"message": message}})
    sys.exit(EXIT_BAD_INPUT)


def _documents(path: str, output: str = "text") -> list[Document]:
    """Validate every document; exit 2 only when the file itself is unusable.

    A document that is not a DSV4Deployment is reported as such (rule `input`) and the others
    are still validated, so one foreign document never hides the findings of the rest.
    """
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except OSError as error:
        _fail(f"cannot read {path}: {error.strerror or error}", output)
    except UnicodeDecodeError:
        _fail(f"{path} is not UTF-8 text", output)
    try:
        docs = load_documents(text)
    except InputError as error:
        _fail(f"{path}: {error}", output)
    if not docs:
        _fail(f"{path} holds no YAML document", output)
    # The same trust policy as an operator configured by these DSV4_* variables.
    try:
        policy = OperatorSettings().trust_policy
    except ValidationError as error:
        first = error.errors()[0]
        name = "DSV4_" + "_".join(str(p) for p in first["loc"]).upper()
        _fail(f"environment variable {name}: {first['msg']}", output)
    results = []
    for index, doc in enumerate(docs, start=1):
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        name = str(meta.get("name", f"document-{index}"))
        namespace = str(meta.get("namespace") or "default")
        try:
            validation = validate_object(doc, policy)
        except NotADeployment as error:
            message = f"not a DSV4Deployment: {error}"
            finding = Finding(rule=INPUT_RULE, severity="error", field="kind", message=message)
            results.append(
                Document(index, name, namespace, Validation(findings=[finding]), message)
            )
            continue
        results.append(Document(index, name, namespace, validation))
    return results


def _exit_code(docs: list[Document]) -> int:
    """The worst document decides: 2 a foreign document, 1 an error finding, else 0."""
    if any(d.foreign for d in docs):
        return EXIT_BAD_INPUT
    return EXIT_OK if all(d.valid for d in docs) else EXIT_FINDINGS


def _finding_dicts(validation: Validation) -> list[dict[str, Any]]:
    return [f.model_dump(mode="json") for f in validation.findings]


def _document_dict(d: Document) -> dict[str, Any]:
    return {"index": d.index, "name": d.name, "namespace": d.namespace}


def _echo_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, ensure_ascii=False))


@dataclass(frozen=True)
class LazyCommand:
    """A command imported only to run it (or for its own --help): where it is, and the line
    `dsv4 --help` lists for it (its own short help: tests/unit/test_cli.py compares them)."""

    path: str  # "module:attribute"
    summary: str


class _LazyGroup(click.Group):
    """A group whose heavy commands are imported when they are looked up to run, not when
    `dsv4` starts nor for `dsv4 --help` (which lists their summaries)."""

    def __init__(self, *args: Any, lazy: dict[str, LazyCommand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, _, attribute = self.lazy[cmd_name].path.partition(":")
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command), self.lazy[cmd_name]
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists commands, a lazy one by its summary (importing them to read their short
        help made `dsv4 --help` 0.62 s, best of 5, against 0.29 s: bench/cli_start.py)."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows: list[tuple[str, str]] = []
        for name in names:
            if name in self.lazy and name not in self.commands:
                # Shortened as click shortens a command's own help.
                summary = click.Command(name, help=self.lazy[name].summary)
                rows.append((name, summary.get_short_help_str(limit)))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(
    cls=_LazyGroup,
    lazy={
        "bisect": LazyCommand(
            "dsv4_operator.bisect_cli:bisect_command",
            "The settings between a last known good and a rejected DSV4Deployment, and a delta "
            "debugging (ddmin) search for the culprit.",
        ),
        "probe": LazyCommand(
            "dsv4_operator.canary.cli:probe_command",
            "Multi-turn tool-calling canary: N sessions x R rounds, every response classified.",
        ),
        "selftest": LazyCommand(
            "dsv4_operator.selftest:selftest_command",
            "Check a running installation, as `helm test` does.",
        ),
    },
    context_settings={"help_option_names": ["-h", "--help"]},
    help="dsv4: validate, plan and render DeepSeek-V4 PD deployments on SGLang.\n\n"
    f"Each command's --help lists its exit codes. {USAGE_ERROR}",
)
@click.version_option(package_name="dsv4-operator")
def main() -> None:
    pass


FILE_OPTION = click.option(
    "-f",
    "--file",
    "path",
    required=True,
    help="DSV4Deployment YAML (multi-document ok; - for stdin).",
)
OUTPUT_OPTION = click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)


@main.command(
    help=with_exit_codes("validate", "Check a spec against the schema and the rule catalogue.")
)
@FILE_OPTION
@OUTPUT_OPTION
def validate(path: str, output: str) -> None:
    docs = _documents(path, output)
    if output == "json":
        _echo_json(
            {
                "valid": all(d.valid for d in docs),
                "documents": [
                    {
                        **_document_dict(d),
                        "valid": d.valid,
                        "findings": _finding_dicts(d.validation),
                    }
                    for d in docs
                ],
            }
        )
    else:
        for d in docs:
            verdict = "valid" if d.valid else "INVALID"
            click.echo(f"{d.name}: {verdict}")
            for f in d.validation.findings:
                click.echo(f"  {f.severity.upper():7} {f.rule:9} {f.field}: {f.message}")
    sys.exit(_exit_code(docs))


_PLAN_ROWS: list[tuple[str, Callable[[RolePlan], str]]] = [
    ("tensor parallel", lambda p: str(p.tensor_parallel)),
    (
        "attention DP / expert parallel",
        lambda p: f"{p.attention_data_parallel} / {p.expert_parallel}",
    ),
    ("nodes per group x GPUs per pod", lambda p: f"{p.nodes_per_replica} x {p.gpus_per_pod}"),
    ("GPU memory GiB", lambda p: f"{p.gpu_memory_bytes / GIB:.1f}"),
    ("static budget GiB", lambda p: f"{p.static_budget_bytes / GIB:.2f}"),
    ("weights GiB", lambda p: f"{p.weights_bytes / GIB:.2f}"),
    ("reserve GiB", lambda p: f"{p.reserve_bytes / GIB:.2f}"),
    ("KV pool GiB", lambda p: f"{p.kv_pool_bytes / GIB:.2f}"),
    ("indexer B/token/C4 layer", lambda p: str(p.indexer_bytes_per_token)),
    ("bytes per full token", lambda p: f"{p.bytes_per_full_token:.2f}"),
    ("engine's estimate", lambda p: f"{p.engine_bytes_per_full_token:.2f}"),
    ("fixed pools GiB", lambda p: f"{p.sizing.fixed_bytes / GIB:.2f}"),
    ("max total tokens", lambda p: str(p.max_total_tokens)),
    ("SWA pool tokens", lambda p: str(p.swa_tokens)),
    ("sessions capacity", lambda p: str(p.sessions_capacity)),
    ("headroom GiB", lambda p: f"{p.headroom_gib:.2f}"),
    ("unpatched over-commit GB", lambda p: f"{p.unpatched_overcommit_bytes / 1e9:.2f}"),
]


def _plan_table(name: str, plan: MemoryPlan) -> str:
    rows = [("per rank", "prefill", "decode")] + [
        (label, fmt(plan.roles["prefill"]), fmt(plan.roles["decode"])) for label, fmt in _PLAN_ROWS
    ]
    width = max(len(r[0]) for r in rows)
    lines = [
        f"{name}: {plan.profiles.model.key}, {plan.profiles.weights_gib:g} GiB weights, "
        f"SGLang {plan.sglang_version} ({plan.profiles.release.pool_arithmetic.value} arithmetic)"
    ]
    lines += [f"  {a:<{width}}  {b:>14}  {c:>14}" for a, b, c in rows]
    return "\n".join(lines)


@main.command(
    help=with_exit_codes(
        "plan",
        "Memory plan per role: bytes per token by pool, max total tokens, capacity, over-commit.",
    )
)
@FILE_OPTION
@OUTPUT_OPTION
def plan(path: str, output: str) -> None:
    docs = _documents(path, output)
    results: list[dict[str, Any]] = []
    for d in docs:
        # Every error finding fails the plan: a role that does not fit is DSV4-R008's.
        planned, findings = d.validation.plan, d.validation.errors
        if output == "text" and planned is not None:
            click.echo(_plan_table(d.name, planned))
        if output == "text":
            verdict = "cannot be planned" if planned is None else "INVALID"
            for f in findings:
                click.echo(f"dsv4: {d.name}: {f.rule} {f.field}: {f.message}", err=True)
            if findings:
                click.echo(f"dsv4: {d.name}: {verdict} ({len(findings)} error findings)", err=True)
        results.append(
            {
                **_document_dict(d),
                "plan": planned.as_dict() if planned else None,
                # What makes the document fail: why it could not be planned, a role that does
                # not fit, or another error finding (none when it is sound).
                "findings": [f.model_dump(mode="json") for f in findings],
            }
        )
    if output == "json":
        _echo_json({"documents": results})
    if any(d.foreign for d in docs):
        sys.exit(EXIT_BAD_INPUT)
    sys.exit(EXIT_FINDINGS if any(r["findings"] for r in results) else EXIT_OK)


@main.command(
    help=with_exit_codes(
        "render", "Every child manifest as multi-document YAML (byte-for-byte deterministic)."
    )
)
@FILE_OPTION
@click.option("-n", "--namespace", default=None, help="Namespace (default: metadata.namespace).")
def render(path: str, namespace: str | None) -> None:
    from dsv4_operator.render.children import render_spec

    docs = _documents(path)
    out: list[dict[str, Any]] = []
    for d in docs:
        if d.foreign:
            _fail(f"{path} document {d.index}: {d.foreign}; nothing rendered")
        if not d.validation.valid or d.validation.spec is None:
            for f in d.validation.errors:
                click.echo(f"dsv4: {d.name}: {f.rule} {f.field}: {f.message}", err=True)
            click.echo(f"dsv4: {d.name} is invalid; nothing rendered", err=True)
            sys.exit(EXIT_FINDINGS)
        out += render_spec(d.name, namespace or d.namespace, d.validation.spec)
    click.echo(yaml.safe_dump_all(out, sort_keys=True, width=100), nl=False)


@main.command(
    help=with_exit_codes(
        "crd",
        "A CustomResourceDefinition generated from the API models: DSV4Deployment, or "
        "DSV4Model with --kind.",
    )
)
@click.option(
    "--kind",
    type=click.Choice([KIND, MODEL_KIND]),
    default=KIND,
    show_default=True,
    help="The kind whose CRD to print.",
)
def crd(kind: str) -> None:
    from dsv4_operator.api.crd import crd_yaml

    click.echo(crd_yaml(kind), nl=False)


@main.command(help=with_exit_codes("rules", "The rule catalogue."))
@OUTPUT_OPTION
def rules(output: str) -> None:
    if output == "json":
        _echo_json({"rules": [r.as_dict() for r in CATALOGUE]})
        return
    click.echo(f"Supported SGLang releases (spec.engine.sglangVersion): {versions_text()}\n")
    for r in CATALOGUE:
        ack = "" if r.acknowledgeable else " (never acknowledgeable)"
        fixed = f"; retired by capability {r.fixed_by.value}" if r.fixed_by else ""
        history = f"\n           history: {r.history()}" if r.history() else ""
        click.echo(
            f"{r.id}  {r.severity:7}  {r.title}{ack}\n           ref: {r.reference}{fixed}\n"
            f"           releases: {', '.join(r.releases) or 'none supported'}{history}"
        )


@main.command()
def run() -> None:
    """Start the operator (configured by DSV4_* environment variables; see docs/settings.md)."""
    from dsv4_operator.handlers.registration import run as run_operator

    run_operator(OperatorSettings())


def _tap_scope(deployment: str, namespace: str | None) -> tuple[str, str]:
    """(name, namespace) of `--deployment` and `--namespace`: a `namespace/name` deployment
    (how the operator's series spelled it before they carried both labels) is split."""
    given, slash, name = deployment.rpartition("/")
    if not slash:
        return deployment, namespace or "default"
    if not given or not name or (namespace is not None and namespace != given):
        _fail(
            f"--deployment {deployment!r}: expected a name or namespace/name"
            + (f" in --namespace {namespace!r}" if namespace is not None else "")
        )
    return name, given


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        _fail(f"{text!r}: expected host:port, for example 0.0.0.0:8100")
    return host, int(port)


@main.command(
    help=with_exit_codes(
        "tap",
        "Run the leak tap: proxy to the router, classify tool calls, serve /metrics, run "
        "the operator's canary against the router when asked.",
    )
)
@click.option("--upstream", required=True, help="The router's URL, e.g. http://127.0.0.1:8000.")
@click.option("--listen", default="0.0.0.0:8100", show_default=True, help="Proxy address.")
@click.option("--metrics", default="0.0.0.0:9100", show_default=True, help="/metrics address.")
@click.option(
    "--deployment",
    required=True,
    help="The DSV4Deployment's name (the `deployment` label); `namespace/name` also sets "
    "--namespace.",
)
@click.option(
    "--namespace",
    default=None,
    help="The DSV4Deployment's namespace (the `namespace` label).  [default: the one in "
    "--deployment, else default]",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 16),
    default=1,
    show_default=True,
    help="Processes relaying on the same port, each with its own classifier (one event loop "
    "relays about 17,000 chunks/s on 0.6 of a core); /metrics sums them.",
)
@click.option(
    "--canary-runs-at-once",
    type=click.IntRange(0, 64),
    default=1,
    show_default=True,
    help="Canary runs the operator may ask of this tap at a time (POST /canary on the "
    "metrics address, against --upstream); 0 serves none.",
)
def tap(
    upstream: str,
    listen: str,
    metrics: str,
    deployment: str,
    namespace: str | None,
    workers: int,
    canary_runs_at_once: int,
) -> None:
    import logging
    import tempfile
    from pathlib import Path

    from dsv4_operator import event_loop
    from dsv4_operator.tap.proxy import TapConfig, run_tap
    from dsv4_operator.tap.workers import WorkerFailed, run_pool

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    name, namespace = _tap_scope(deployment, namespace)
    config = TapConfig(
        upstream.rstrip("/"),
        deployment=name,
        namespace=namespace,
        canary_runs_at_once=canary_runs_at_once,
    )
    try:
        config.router_address()
    except ValueError as exc:
        _fail(f"--upstream: {exc}")
    proxy, scrape = _address(listen), _address(metrics)
    if workers > 1 and proxy[1] == 0:
        _fail("--listen: a port of 0 would give each worker a port of its own; name one")
    if workers == 1:
        # libuv's event loop: the tap's per-chunk cost is mostly the loop's own (bench/tap.py).
        event_loop.run(run_tap(config, proxy, scrape))
        return
    with tempfile.TemporaryDirectory(prefix="dsv4-tap-") as sockets:
        try:
            event_loop.run(run_pool(config, proxy, scrape, workers, Path(sockets)))
        except WorkerFailed as exc:
            _fail(f"--workers {workers}: {exc}")


if __name__ == "__main__":
    main()
