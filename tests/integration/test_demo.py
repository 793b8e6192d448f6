"""`make demo` (`dsv4-demo`) run as a user runs it, on the playground, its output read: the
upstream deployment Ready, the unsafe change denied with DSV4-R001, the leaking change rolled
back by the guard and quarantined, the leak rate and the alert read from a real Prometheus, and
each printed `$ command` followed by its real output."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.integration


@pytest.mark.long(seconds=110)
def test_the_demo_tells_the_story_ready_denied_rolled_back_and_seen_in_prometheus() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "dsv4_demo"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    print(out)
    print(f"demo wall time: {time.monotonic() - started:.1f}s")
    assert done.returncode == 0, out[-4000:]

    # 1. The upstream example, installed by the chart with the webhook on, Ready.
    assert "$ kubectl apply -f examples/dsv4-sglang-0.5.23.yaml" in out
    assert "dsv4deployment.dsv4.io/dsv4-flash-upstream condition met" in out
    assert re.search(r"dsv4-flash-upstream\s+Ready\s", out), out
    # 2. The unsafe change denied by the webhook with the rule's message.
    assert 'admission webhook "rules.dsv4.io.validation" denied the request' in out
    assert "[DSV4-R001] bf16 index-K with HiCache" in out
    # 3. The leaking change accepted, then rolled back by the guard and quarantined; the engine
    #    is said to be the double, with what it was told.
    assert "engine TEST DOUBLE" in out and "DSV4_DOUBLE_LEAK_WHEN=--max-running-requests=96" in out
    assert re.search(r"rolled back by itself \d+\.\ds after the change was accepted", out), out
    assert re.search(r'"reason": "LeakRate",\s+"revision": "dsv4-flash-upstream-\w+"', out), out
    assert re.search(r"Type:\s+RolledBack", out) and re.search(r"Phase:\s+RolledBack", out), out
    assert re.search(r"Warning\s+RolledBack\s+.*LeakRate: \d+/\d+ responses leaked", out), out
    # 4. The leak rate of the rolled-back revision and the alerts, from Prometheus (promtool).
    [bad] = re.findall(r'"hash": "(\w+)"', out)
    leak = re.search(rf'\{{[^}}]*revision="{bad}"[^}}]*\}} => ([0-9.]+)', out)
    assert leak and float(leak[1]) > 0.02, out
    assert re.search(r'alertname="DSV4LeakRateHigh".*alertstate="firing"', out), out
    assert re.search(r'alertname="DSV4RollbackPerformed".*alertstate="firing"', out), out
    # 5. Every printed command is followed by output (none is a caption).
    for command, output in re.findall(r"^\$ (.+)\n(.*)$", out, re.M):
        assert output.strip(), f"no output after `$ {command}`"
