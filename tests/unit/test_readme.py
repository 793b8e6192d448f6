"""The README guides and stays small; it and the docs pages it sends readers to stay true to
the code: the quickstart's commands, the rule catalogue, the exit codes of `dsv4`."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dsv4_operator import cli, exit_codes, selftest
from dsv4_operator.engine.rules import CATALOGUE
from tests.support.paths import EXAMPLE, REPO

README_PATH = REPO / "README.md"
README = README_PATH.read_text()
DOCS = REPO / "docs"
MAX_README_BYTES = 10_240


def _section(title: str) -> str:
    """The README's `## title` section, up to the next one."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def _local_links(page: Path) -> list[str]:
    prose = re.sub(r"`[^`\n]*`", "", page.read_text())  # code spans hold no links
    return [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose) if "://" not in t]


def test_the_readme_stays_small() -> None:
    size = len(README_PATH.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes; move reference to docs/"


def test_quickstart_sets_up_with_exactly_make_demo_and_make_test() -> None:
    blocks = re.findall(r"```bash\n(.*?)```", _section("Quickstart"), re.S)
    commands = [
        line.split("#")[0].strip()
        for block in blocks
        for line in block.splitlines()
        if line.split("#")[0].strip()
    ]
    assert commands == ["make demo", "make test"]


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (REPO / ".ci" / "run").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_the_readme_tells_the_incident_and_guides_in_order() -> None:
    why = _section("Why")
    for fact in ("DeepSeek-V4-Flash", "12-18%", "60-80 concurrent", "0%", "valid alone"):
        assert fact in why, fact
    titles = re.findall(r"^## (.+)$", README, re.M)
    assert titles == ["Why", "Quickstart", "Install in a cluster", "A first deployment", "Read on"]


def test_the_readme_keeps_no_reference_tables() -> None:
    """Reference lives once, in docs/: no rule rows, metric rows or settings rows here."""
    for row in (r"^\| DSV4-R\d", r"^\| `dsv4_", r"^\| `DSV4_"):
        assert not re.search(row, README, re.M), row


def test_readme_commands_and_files_exist() -> None:
    install = _section("Install in a cluster")
    assert "helm install dsv4-operator charts/dsv4-operator" in install
    for path in re.findall(r"\b((?:examples|charts|images)/[\w./-]+\w)", README):
        assert (REPO / path).exists(), path


def test_links_from_the_readme_and_the_docs_index_resolve_and_reach_every_page() -> None:
    for page in (README_PATH, DOCS / "README.md"):
        for target in _local_links(page):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
    index = {(DOCS / t).resolve() for t in _local_links(DOCS / "README.md")}
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            assert page.resolve() in index, f"docs/README.md does not link {page.name}"
    from_readme = {(REPO / t).resolve() for t in _local_links(README_PATH)}
    for name in ("cli", "metrics", "settings", "rules", "guard", "operator", "development"):
        assert (DOCS / f"{name}.md").resolve() in from_readme, name


def test_nothing_points_outside_the_repository() -> None:
    for page in (README_PATH, *DOCS.rglob("*.md")):
        text = page.read_text()
        assert "../shared" not in text, page
        assert not re.search(r"design doc", text, re.I), page


def test_rule_table_matches_catalogue() -> None:
    text = (DOCS / "rules.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| DSV4-R")]
    expected = [
        f"| {r.id} | {r.severity} | {'yes' if r.acknowledgeable else 'never'} | {r.title} | "
        f"{r.fixed_by.value if r.fixed_by else '-'} | {', '.join(r.releases)} | "
        f"{r.history() or '-'} | {', '.join(f'`{f}`' for f in r.reads)} | {r.reference} |"
        for r in CATALOGUE
    ]
    assert rows == expected


def test_every_command_but_run_documents_its_exit_codes() -> None:
    # Every command, those imported on demand (probe, selftest) included.
    commands = cli.main.list_commands(click.Context(cli.main))
    assert set(cli.EXIT_CODES) == set(commands) - {"run"}
    probe = {code for code, _ in cli.EXIT_CODES["probe"]}
    assert probe == {
        exit_codes.EXIT_OK,
        exit_codes.EXIT_LEAKING,
        exit_codes.EXIT_BAD_INPUT,
        exit_codes.EXIT_INCONCLUSIVE,
    }


@pytest.mark.parametrize(
    ("path", "meaning"),
    [
        (EXAMPLE, "no error finding"),
        (REPO / "examples" / "unsafe" / "r001-bf16-hicache-no-gate.yaml", "an error finding"),
        (REPO / "examples" / "missing.yaml", "FILE unreadable"),
    ],
)
def test_validate_exits_with_the_documented_code(path: Path, meaning: str) -> None:
    result = CliRunner().invoke(cli.main, ["validate", "-f", str(path)])
    documented = [code for code, text in cli.EXIT_CODES["validate"] if text.startswith(meaning)]
    assert [result.exit_code] == documented, result.output


@pytest.mark.parametrize("passed", [True, False])
def test_selftest_exits_with_the_documented_code(
    monkeypatch: pytest.MonkeyPatch, passed: bool
) -> None:
    async def checks(kubeconfig: str | None, **kwargs: object) -> list[selftest.InstallationCheck]:
        return [
            selftest.InstallationCheck("operator", passed, "Available" if passed else "Missing", "")
        ]

    monkeypatch.setattr(selftest, "_checks", checks)
    args = ["selftest", "--namespace", "n", "--deployment", "d", "--target-namespace", "t"]
    result = CliRunner().invoke(cli.main, args)
    meaning = "every check passed" if passed else "a check failed"
    documented = [code for code, text in cli.EXIT_CODES["selftest"] if text.startswith(meaning)]
    assert [result.exit_code] == documented, result.output
