"""The suite's own layout rules: no test module imports another test module or a conftest (what
they share lives in tests/support, or in a tier's `*_support.py`), and the benchmarks import
nothing from tests/ (they use the installed test support: dsv4_devcluster, dsv4_engine_double)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import REPO


def imports_in(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, a module of `package`, those
    inside functions too; `from . import x` yields the package's module `x` as well."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            yield node.lineno, base
            if node.module is None:
                for alias in node.names:
                    yield node.lineno, f"{base}.{alias.name}"


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    package = ".".join(path.relative_to(REPO).parts[:-1])
    return imports_in(path.read_text(), package)


def is_test_module(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return module.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def test_no_test_module_imports_another_test_module_or_a_conftest() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        for line, module in imports_of(path)
        if is_test_module(module)
    ]
    assert found == []


def test_the_benchmarks_import_nothing_from_tests() -> None:
    scripts = sorted((REPO / "bench").glob("*.py"))
    found = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in scripts
        for line, module in imports_of(path)
        if module == "tests" or module.startswith("tests.")
    ]
    assert found == []
    assert [p.name for p in scripts if "sys.path.insert" in p.read_text()] == []


def test_the_rule_sees_relative_absolute_and_nested_imports() -> None:
    source = (
        "from .test_decide import make_world\n"
        "from . import conftest\n"
        "import tests.integration.test_tap\n"
        "def f():\n"
        "    from ..chart.test_chart import CRD_RULE\n"
        "from tests.support.builders import NOW\n"
        "from .cluster_support import exists\n"
    )
    modules = [module for _, module in imports_in(source, "tests.unit")]
    assert sorted(m for m in modules if is_test_module(m)) == [
        "tests.chart.test_chart",
        "tests.integration.test_tap",
        "tests.unit.conftest",
        "tests.unit.test_decide",
    ]
    assert "tests.support.builders" in modules and "tests.unit.cluster_support" in modules
