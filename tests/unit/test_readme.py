"""The README's rule catalogue and quickstart stay true to the code."""

from __future__ import annotations

from dsv4_operator.engine.rules import CATALOGUE

from .conftest import REPO

README = (REPO / "README.md").read_text()


def test_rule_table_matches_catalogue() -> None:
    rows = [line for line in README.splitlines() if line.startswith("| DSV4-R")]
    expected = [
        f"| {r.id} | {r.severity} | {'yes' if r.acknowledgeable else 'never'} | {r.title} | "
        f"{r.fixed_by.value if r.fixed_by else '-'} | {', '.join(r.releases)} | {r.reference} |"
        for r in CATALOGUE
    ]
    assert rows == expected


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in README and "make demo" in README
    assert "make test" in (REPO / ".ci" / "run").read_text()
