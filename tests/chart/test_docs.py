"""User docs: the generated pages and regions follow the code (CRD, rule catalogue, metrics,
settings, exit codes); local links resolve; the RBAC and metrics tables match what the chart
grants and the operator exports."""

from __future__ import annotations

import functools
import re
import runpy
import sys
from typing import Any

from dsv4_operator.cli import EXIT_CODES
from dsv4_operator.settings import OperatorSettings

from .support import CRD_RULE, NAMESPACE_RULE, NAMESPACED_RULES, OPERATOR_METRICS, REPO, run

DOCS = REPO / "docs"


@functools.cache
def gen_docs() -> dict[str, Any]:
    """tools/gen_docs.py's names (a script, not a package)."""
    return runpy.run_path(str(REPO / "tools" / "gen_docs.py"))


def test_generated_docs_are_up_to_date() -> None:
    proc = run([sys.executable, REPO / "tools" / "gen_docs.py", "--check"], check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_generated_region_is_marked_once_and_drift_in_it_is_caught() -> None:
    """An edit inside a generated region is drift (--check reports it, a run undoes it); the
    hand-written text around it is kept."""
    gen = gen_docs()
    regions = [o for o in gen["OUTPUTS"] if o.region is not None]
    assert {o.region for o in regions} >= {
        "operator metrics",
        "tap metrics",
        "settings",
        "exit codes",
        "labels",
    }
    pages = {o.path.name for o in gen["OUTPUTS"] if o.region is None}
    assert pages >= {"crd-reference.md", "rules.md"}
    for output in regions:
        text = output.path.read_text()
        begin, end = (marker.format(output.region) for marker in output.markers)
        assert text.count(begin) == 1 and text.count(end) == 1, (output.path, output.region)
        inside = text.index(begin) + len(begin)
        edited = f"hand-written {output.region}\n" + text[:inside] + "\n| stale |" + text[inside:]
        assert gen["expected"](output.path, edited) == f"hand-written {output.region}\n" + text


def test_crd_reference_documents_every_spec_field() -> None:
    text = (DOCS / "crd-reference.md").read_text()
    for field in (
        "spec.engine.indexKDtype",
        "spec.engine.capabilities",
        "spec.guard.leakRate.threshold",
        "spec.safety.acknowledge",
        "status.quarantine",
    ):
        assert f"| `{field}` |" in text, field


def test_local_links_in_the_user_docs_resolve() -> None:
    pages = [*DOCS.glob("*.md"), REPO / "images" / "engine" / "README.md"]
    for page in pages:
        prose = re.sub(r"`[^`\n]*`", "", page.read_text())  # code spans hold no links
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_install_doc_lists_the_rbac_the_chart_grants() -> None:
    text = (DOCS / "install.md").read_text()
    for rule in [*NAMESPACED_RULES, CRD_RULE, NAMESPACE_RULE]:
        group = rule["apiGroups"][0] or '""'
        row = f"| {group} | {', '.join(rule['resources'])} | {', '.join(rule['verbs'])} |"
        assert row in text, row


def test_every_exported_metric_is_documented_once() -> None:
    metrics = (DOCS / "metrics.md").read_text()
    for name in OPERATOR_METRICS:
        assert metrics.count(f"| `{name}` |") == 1, f"docs/metrics.md's tables lack {name}"
    others = [REPO / "README.md", *(p for p in DOCS.glob("*.md") if p.name != "metrics.md")]
    for page in others:
        assert not re.search(r"^\| `dsv4_", page.read_text(), re.M), f"{page.name}: a metric row"


def test_the_weights_job_exports_no_metrics() -> None:
    """docs/metrics.md says so: the Job reports progress on its own annotation instead."""
    for module in (REPO / "operator" / "dsv4_operator" / "weights").glob("*.py"):
        assert "prometheus_client" not in module.read_text(), module.name


def test_every_setting_and_exit_code_is_documented() -> None:
    settings = (DOCS / "settings.md").read_text()
    for name in OperatorSettings.model_fields:
        assert f"| `DSV4_{name.upper()}` |" in settings, name
    cli = (DOCS / "cli.md").read_text()
    for command, codes in EXIT_CODES.items():
        for code, _ in codes:
            assert f"| `dsv4 {command}` | {code} |" in cli, (command, code)
