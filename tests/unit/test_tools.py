"""The suite's own tools: the conformance locks pin exactly what the releases list, and the
suite runner picks a stage's prerequisites and reads the slowest tests from JUnit XML."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dsv4_operator.engine.releases import supported_versions
from tests.support.paths import REPO


def _tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


conformance_env = _tool("conformance_env")
suite = _tool("suite")


@pytest.mark.parametrize("version", supported_versions())
def test_each_supported_release_has_a_lock_that_pins_its_list(version: str) -> None:
    lock = conformance_env.read_lock(version)  # exits naming the fix when it drifted
    assert lock.count("--hash=sha256:") >= len(conformance_env.requirement_list(version))
    assert f"sglang=={version}" in conformance_env.locked_pins(lock)


def test_a_lock_that_drifted_from_the_list_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    version = supported_versions()[0]
    release = dict(conformance_env.RELEASES[version])
    release["requirements"] = [*release["requirements"], "six==1.16.0"]
    monkeypatch.setitem(conformance_env.RELEASES, version, release)
    with pytest.raises(SystemExit, match=f"conformance_env.py {version} --lock"):
        conformance_env.read_lock(version)


def test_pins_compare_as_pep_503_names_and_pep_440_versions() -> None:
    assert conformance_env.normalised("Cuda_Toolkit==13.0.3.0") == "cuda-toolkit==13.0.3"
    assert conformance_env.normalised("torch==2.14.1") == "torch==2.14.1"
    assert conformance_env.normalised("x==10.0") == "x==10"


def test_a_stage_brings_what_it_needs_in_the_suites_order() -> None:
    names = [s.name for s in suite.selected(["integration"])]
    assert names == ["venv", "tools", "k8s-binaries", "integration"]
    assert [s.name for s in suite.selected([])] == [s.name for s in suite.stages()]
    with pytest.raises(SystemExit, match="unknown stage"):
        suite.selected(["everything"])


def test_the_slowest_tests_come_from_every_stages_junit_xml(tmp_path: Path) -> None:
    (tmp_path / "unit.xml").write_text(
        '<testsuites><testsuite><testcase classname="tests.unit.test_a" name="test_x" '
        'time="0.5"/><testcase classname="tests.unit.test_a" name="test_y" time="2.0"/>'
        "</testsuite></testsuites>"
    )
    (tmp_path / "integration.xml").write_text(
        '<testsuite><testcase classname="tests.integration.test_b" name="test_z" time="9.25"/>'
        "</testsuite>"
    )
    (tmp_path / "chart.xml").write_text("<not-closed")  # a stage killed mid-write: skipped
    slow = suite.slowest_tests(tmp_path, ["unit", "integration", "chart", "lint"])
    assert slow == [
        (9.25, "integration", "tests.integration.test_b::test_z"),
        (2.0, "unit", "tests.unit.test_a::test_y"),
        (0.5, "unit", "tests.unit.test_a::test_x"),
    ]


def test_a_test_stage_waits_for_the_machine_and_is_dropped_only_when_a_need_failed() -> None:
    runner = suite.Runner(suite.selected(["unit", "lint"]), make="make")
    venv, lint, unit = (runner.by_name[n] for n in ("venv", "lint", "unit"))
    assert runner._ready(unit) is None  # venv not done yet
    venv.returncode = 0
    assert runner._ready(venv.__class__("io", "io", kind="io")) is True
    runner.testing = True  # lint holds the machine
    assert runner._ready(unit) is None and not unit.skipped
    runner.testing = False
    assert runner._ready(unit) is True
    venv.returncode = 2
    assert runner._ready(lint) is False and lint.skipped == "needs venv, which did not pass"
