"""Who may import whom among the operator's packages (read from the source).

No two packages import each other, even through others; the detector (leak/) stands alone; the
guard's decision (guard/) is pure, so it reaches neither the Kubernetes client nor the metrics;
metrics.py does not reach into the guard. One alias, `Obj`, names a Kubernetes object as
JSON, declared once in kube/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dsv4_operator

PACKAGE = Path(dsv4_operator.__file__).resolve().parent


def _file(module: str) -> Path | None:
    """The source file of a dsv4_operator module, None for a name that is not a module."""
    path = PACKAGE.joinpath(*module.split(".")[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """The dsv4_operator modules a file imports, at the top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("dsv4_operator.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsv4_operator"):
            module = str(node.module)
            found.add(module)  # `from dsv4_operator.x import name` also runs x's __init__
            found |= {f"{module}.{a.name}" for a in node.names if _file(f"{module}.{a.name}")}
    return found - {"dsv4_operator"}


def _reach(package: str) -> set[str]:
    """Every dsv4_operator module that importing any module of `package` may import."""
    root = PACKAGE / package
    paths = sorted(root.glob("*.py")) if root.is_dir() else [root.with_suffix(".py")]
    todo = [_module(p) for p in paths]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _file(module)
        if path is not None:
            todo += _imports(path)
    return seen


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _within(module: str, package: str) -> bool:
    return module == f"dsv4_operator.{package}" or module.startswith(f"dsv4_operator.{package}.")


def test_the_walk_sees_imports() -> None:
    # Guard against a walk that finds nothing and so forbids nothing.
    assert "dsv4_operator.kube.reader" in _reach("signals")
    assert "dsv4_operator.metrics" in _reach("signals")


def test_the_detector_imports_nothing_else_of_the_operator() -> None:
    assert {m for m in _reach("leak") if not _within(m, "leak")} == set()


@pytest.mark.parametrize("forbidden", ["kube", "metrics", "signals", "reconcile", "handlers"])
def test_the_guard_decision_is_pure(forbidden: str) -> None:
    assert {m for m in _reach("guard") if _within(m, forbidden)} == set()


def test_metrics_do_not_import_the_guard() -> None:
    assert {m for m in _reach("metrics") if _within(m, "guard")} == set()


def test_the_tap_runs_the_canary_and_neither_reaches_the_guard_or_the_cluster() -> None:
    """The tap runs the operator's canary runs (canary/remote.py), so it may import the
    canary and the guard's HTTP client; the canary never imports the tap, and neither the
    guard's decisions nor the Kubernetes client (the tap is a sidecar with no API access)."""
    tap, canary = _reach("tap"), _reach("canary")
    assert "dsv4_operator.leak.classifier" in tap and "dsv4_operator.leak.classifier" in canary
    assert "dsv4_operator.canary.remote" in tap
    apart = ("guard", "kube", "reconcile", "handlers", "runtime")
    assert {m for m in tap if any(_within(m, p) for p in apart)} == set()
    assert {m for m in canary if _within(m, "tap") or any(_within(m, p) for p in apart)} == set()


def _package_of(module: str) -> str:
    """`guard` for dsv4_operator.guard.decision, `metrics` for dsv4_operator.metrics."""
    return module.split(".")[1]


def _package_graph() -> dict[str, set[str]]:
    """Which top-level package (or module) of dsv4_operator imports which, directly."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = (
            _package_of(_module(path)) if path.parent != PACKAGE or path.stem != "__init__" else ""
        )
        if not source:
            continue
        targets = {_package_of(m) for m in _imports(path)} - {source}
        graph.setdefault(source, set()).update(targets)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_packages() -> None:
    graph = _package_graph()
    assert {"guard", "signals", "runtime", "reconcile", "api", "engine"} <= set(graph)
    assert _cycles(graph) == [], {p: sorted(t) for p, t in sorted(graph.items())}


def test_the_cycle_finder_finds_a_cycle() -> None:
    # A finder that never finds one would pass the test above vacuously.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _assigned_names(tree: ast.AST) -> set[str]:
    """Names a module binds by assignment, anywhere in it (`X = ...`, `X: T = ...`)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


OBJ_HOME = PACKAGE / "kube" / "objects.py"


def test_one_obj_alias_declared_in_kube() -> None:
    """`Obj` (a Kubernetes object as JSON) is declared once, in kube/objects.py; every other
    module imports it from there."""
    assert "Obj" in _assigned_names(ast.parse(OBJ_HOME.read_text(encoding="utf-8")))
    declaring = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path != OBJ_HOME and "Obj" in _assigned_names(ast.parse(path.read_text("utf-8")))
    )
    assert declaring == []


def test_the_alias_finder_finds_an_alias() -> None:
    # A finder that never finds one would pass the test above vacuously.
    assert "Obj" in _assigned_names(ast.parse("from typing import Any\nObj = dict[str, Any]\n"))
    assert "Obj" in _assigned_names(ast.parse("if True:\n    Obj: type = dict\n"))


@pytest.mark.parametrize(
    "forbidden", ["kube", "metrics", "signals", "reconcile", "handlers", "canary", "runtime"]
)
def test_the_bisection_is_pure(forbidden: str) -> None:
    """bisect/ (the delta, the search, outcomes) is shared by the operator and `dsv4 bisect`:
    it decides, the callers run probes."""
    assert {m for m in _reach("bisect") if _within(m, forbidden)} == set()
