#!/usr/bin/env python3
"""The whole suite as `make test` and CI run it: each stage once its inputs are ready, and at
the end where the time went (each stage's wall time, the 15 slowest tests) and what failed.

Stages are Makefile targets (the Makefile stays the one place that says how each is run).
Downloads and the Go build run beside the test stages at a lower CPU priority (installs at
nice 10, the Go build at nice 19), so that on a fresh machine they take the CPU the tests
leave idle, and the test stages run one at a time, each with the machine to itself as far
as it can use it. A failed stage does not stop the others that do not need it; the exit code
is 0 only when every stage passed. Standard library only: it runs before any virtualenv
exists.

    python3 tools/suite.py                 # what `make test` runs
    python3 tools/suite.py unit lint       # only these stages and what they need
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / ".suite"  # JUnit XML of each pytest stage, one log per stage
SLOWEST = 15
TAIL_LINES = 60


@dataclass
class Stage:
    name: str
    target: str  # the Makefile target
    needs: tuple[str, ...] = ()
    # "test": one at a time, in the order listed; "io": downloads and installs, beside
    # anything at nice 10; "background": CPU-heavy builds, beside anything at nice 19.
    kind: str = "test"
    what: str = ""
    started: float | None = None
    ended: float | None = None
    returncode: int | None = None
    skipped: str = ""
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))

    @property
    def wall(self) -> float:
        if self.started is None:
            return 0.0
        return (self.ended or time.monotonic()) - self.started

    @property
    def result(self) -> str:
        if self.skipped:
            return f"not run ({self.skipped})"
        if self.returncode is None:
            return "not run"
        return "ok" if self.returncode == 0 else f"FAILED (exit {self.returncode})"


def stages() -> list[Stage]:
    return [
        Stage("venv", "install", kind="io", what=".venv: pip install -e '.[test]'"),
        Stage("venv-newest", "install-newest", kind="io", what=".venv-newest: Python 3.13"),
        Stage("tools", "tools", ("venv",), "io", "helm, kubectl, promtool, prometheus, hadolint"),
        Stage("conformance-envs", "conformance-envs", ("venv",), "io", "one env per release"),
        Stage("k8s-binaries", "k8s-binaries", kind="background", what="tools/build-k8s.sh"),
        Stage("lint", "ruff", ("venv",), what="ruff check, ruff format --check"),
        Stage("types", "types", ("venv",), what="mypy --strict"),
        Stage("unit", "unit", ("venv",), what="tests/unit on Python 3.11"),
        Stage("unit-3.13", "unit-newest", ("venv-newest",), what="tests/unit on Python 3.13"),
        Stage("chart", "test-chart", ("venv", "tools"), what="tests/chart"),
        Stage("conformance", "test-conformance", ("venv", "conformance-envs")),
        Stage(
            "integration",
            "test-integration",
            ("venv", "tools", "k8s-binaries"),
            what="tests/integration (one control plane per worker)",
        ),
    ]


class Runner:
    def __init__(self, plan: list[Stage], make: str) -> None:
        self.plan = plan
        self.by_name = {s.name: s for s in plan}
        self.make = make
        self.t0 = time.monotonic()
        self.lock = threading.Condition()
        self.testing = False  # a "test" stage holds the machine
        self.print_lock = threading.Lock()

    def say(self, line: str) -> None:
        with self.print_lock:
            print(line, flush=True)

    def _ready(self, stage: Stage) -> bool | None:
        """True to start now, None to wait, False when a stage it needs did not pass."""
        for need in stage.needs:
            dep = self.by_name.get(need)
            if dep is None:
                continue  # not selected: assumed done by an earlier run
            if dep.skipped or (dep.returncode not in (None, 0)):
                stage.skipped = f"needs {need}, which did not pass"
                return False
            if dep.returncode is None:
                return None
        if stage.kind == "test" and self.testing:
            return None  # one test stage at a time: the first one ready, in order, is next
        return True

    def run(self) -> int:
        REPORTS.mkdir(exist_ok=True)
        pending = list(self.plan)
        threads: list[threading.Thread] = []
        with self.lock:
            while pending or any(t.is_alive() for t in threads):
                for stage in list(pending):
                    ready = self._ready(stage)
                    if ready is False:
                        pending.remove(stage)
                        self.say(f"[suite] {stage.name}: not run ({stage.skipped})")
                    elif ready:
                        pending.remove(stage)
                        if stage.kind == "test":
                            self.testing = True
                        stage.started = time.monotonic()
                        thread = threading.Thread(target=self._run_stage, args=(stage,))
                        threads.append(thread)
                        thread.start()
                self.lock.wait(timeout=5)
        for thread in threads:
            thread.join()
        self.report()
        failed = [s for s in self.plan if s.returncode != 0]
        return 1 if failed else 0

    def _run_stage(self, stage: Stage) -> None:
        self.say(f"[suite] {stage.name}: started at {self._clock(stage.started)} ({stage.what})")
        argv = [self.make, "--no-print-directory", stage.target]
        niceness = {"io": 10, "background": 19}.get(stage.kind)
        if niceness is not None:  # the test stages' timings stay their own
            argv = ["nice", "-n", str(niceness), *argv]
        env = dict(os.environ, DSV4_REPORTS=str(REPORTS), PYTHONUNBUFFERED="1")
        log_path = REPORTS / f"{stage.name}.log"
        try:
            with log_path.open("w") as log:
                proc = subprocess.Popen(
                    argv,
                    cwd=REPO,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                )
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    stage.tail.append(line.rstrip("\n"))
                    self.say(f"[{stage.name}] {line.rstrip()}")
                returncode = proc.wait()
        except OSError as error:
            stage.tail.append(f"could not run {argv}: {error}")
            returncode = 127
        with self.lock:
            stage.ended, stage.returncode = time.monotonic(), returncode
            if stage.kind == "test":
                self.testing = False
            self.lock.notify_all()
        self.say(f"[suite] {stage.name}: {stage.result} after {_minutes(stage.wall)}")

    def _clock(self, at: float | None) -> str:
        return _minutes((at or self.t0) - self.t0)

    def report(self) -> None:
        total = time.monotonic() - self.t0
        width = max(len(s.name) for s in self.plan)
        lines = ["", f"== where the time went: {_minutes(total)} in all ==", ""]
        lines.append(f"{'stage':<{width}}  {'start':>6}  {'wall':>6}  result")
        for s in self.plan:
            start = self._clock(s.started) if s.started else "-"
            wall = _minutes(s.wall) if s.started else "-"
            lines.append(f"{s.name:<{width}}  {start:>6}  {wall:>6}  {s.result}")
        slow = slowest_tests(REPORTS, [s.name for s in self.plan])
        if slow:
            lines += ["", f"{len(slow)} slowest tests (setup + call + teardown):"]
            lines += [f"  {secs:7.1f} s  {stage:<12} {test}" for secs, stage, test in slow]
        for s in self.plan:
            if s.returncode not in (0, None):
                lines += ["", f"-- {s.name} failed; its last lines (all in {REPORTS.name}/"]
                lines[-1] += f"{s.name}.log) --"
                lines += list(s.tail)
        self.say("\n".join(lines))


def slowest_tests(reports: Path, names: list[str]) -> list[tuple[float, str, str]]:
    """(seconds, stage, test) of the slowest tests in the stages' JUnit XML files."""
    found = []
    for name in names:
        path = reports / f"{name}.xml"
        if not path.is_file():
            continue
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append((float(case.get("time") or 0), name, test))
    return sorted(found, reverse=True)[:SLOWEST]


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def selected(names: list[str]) -> list[Stage]:
    """The named stages and every stage they need, in the suite's order."""
    plan = stages()
    if not names:
        return plan
    by_name = {s.name: s for s in plan}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"suite: unknown stage {unknown}; stages: {', '.join(by_name)}")
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += by_name[name].needs
    return [s for s in plan if s.name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="*", help="stages to run (default: all)")
    parser.add_argument("--make", default=os.environ.get("MAKE", "make"))
    args = parser.parse_args(argv)
    return Runner(selected(args.stages), args.make).run()


if __name__ == "__main__":
    sys.exit(main())
