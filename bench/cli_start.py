"""Benchmark: how fast `dsv4 validate` and `dsv4 plan` start, cold, against `python -c pass`.

Each command runs as a fresh process `--runs` times (best and median wall time), interleaved
with the interpreter's own start (`python -c pass`) so that the ratio is read in the same run
on a shared machine. Then one `python -X importtime` run of each command lists the modules that
cost the most (cumulative, and the top-level imports of the `dsv4` module itself), and which
of the heavy packages the command never needs (the Kubernetes client, kopf, httpx,
prometheus_client, aiohttp, jsonschema) it loaded.

    python bench/cli_start.py [--file examples/dsv4.yaml] [--runs 5] [--top 12]
        [--reference DIR]

`--reference DIR` also times the same commands with another checkout's `operator/` directory
first on PYTHONPATH (say `git archive main operator | tar -x -C /tmp/main`, then
`--reference /tmp/main/operator`), interleaved with this one: before and after in one run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("kubernetes", "kopf", "httpx", "prometheus_client", "aiohttp", "jsonschema", "uvloop")
_IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


@dataclass(frozen=True)
class Imported:
    """One line of `-X importtime`: self and cumulative microseconds, nesting depth."""

    module: str
    self_us: int
    cumulative_us: int
    depth: int


def _run_seconds(argv: list[str], env: dict[str, str] | None) -> float:
    began = time.perf_counter()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - began


def _importtime(argv: list[str]) -> list[Imported]:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        check=False,
        capture_output=True,
        text=True,
    )
    rows = []
    for line in done.stderr.splitlines():
        match = _IMPORT_LINE.match(line)
        if match:
            self_us, cumulative_us, indent, module = match.groups()
            rows.append(Imported(module, int(self_us), int(cumulative_us), len(indent) // 2))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(ROOT / "examples" / "dsv4.yaml"))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--reference", help="another checkout's operator/ directory")
    args = parser.parse_args()

    dsv4 = str(Path(sys.executable).with_name("dsv4"))
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "dsv4 validate": [dsv4, "validate", "-f", args.file],
        "dsv4 plan": [dsv4, "plan", "-f", args.file],
        "dsv4 --help": [dsv4, "--help"],
    }
    variants: dict[str, tuple[list[str], dict[str, str] | None]] = {
        name: (argv, None) for name, argv in commands.items()
    }
    if args.reference:
        reference = {**os.environ, "PYTHONPATH": args.reference}
        for name in ("dsv4 validate", "dsv4 plan", "dsv4 --help"):
            variants[f"{name} (reference)"] = (commands[name], reference)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.runs):  # interleaved: load on the machine hits every command alike
        for name, (argv, env) in variants.items():
            times[name].append(_run_seconds(argv, env))
    baseline = min(times["python -c pass"])
    print(f"cold start, {args.runs} runs each, interleaved ({args.file}):")
    for name, runs in times.items():
        print(
            f"  {name:27} best {min(runs):.3f} s, median {statistics.median(runs):.3f} s "
            f"({min(runs) / baseline:.1f}x python -c pass)"
        )
    for command in ("validate", "plan"):
        rows = _importtime(["-m", "dsv4_operator.cli", command, "-f", args.file])
        total = sum(r.cumulative_us for r in rows if r.depth == 0)
        heavy = sorted({r.module.split(".")[0] for r in rows} & set(HEAVY))
        print(
            f"\npython -X importtime -m dsv4_operator.cli {command}: {total / 1000:.0f} ms of "
            f"imports; heavy packages loaded: {', '.join(heavy) or 'none'}"
        )
        print(f"  top {args.top} by cumulative time:")
        for r in sorted(rows, key=lambda r: -r.cumulative_us)[: args.top]:
            print(f"    {r.cumulative_us / 1000:7.1f} ms  {'  ' * r.depth}{r.module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
