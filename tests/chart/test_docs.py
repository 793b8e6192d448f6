"""User docs: the generated pages follow the CRD and the rule catalogue; local links resolve;
the RBAC and metrics tables match what the chart grants and the operator exports."""

from __future__ import annotations

import re
import sys

from .support import OPERATOR_METRICS, REPO, run
from .test_chart import CRD_RULE, NAMESPACE_RULE, NAMESPACED_RULES

DOCS = REPO / "docs"


def test_generated_docs_are_up_to_date() -> None:
    proc = run([sys.executable, REPO / "tools" / "gen_docs.py", "--check"], check=False)
    assert proc.returncode == 0, proc.stderr


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


def test_every_exported_metric_is_documented() -> None:
    readme = (REPO / "README.md").read_text()
    guard = (DOCS / "guard.md").read_text()
    for name in OPERATOR_METRICS:
        assert f"| `{name}` |" in readme, f"README's metrics table lacks {name}"
        assert f"| `{name}` |" in guard, f"docs/guard.md's metrics table lacks {name}"
