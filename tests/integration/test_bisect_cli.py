"""`dsv4 bisect --url-for` against engine doubles: the incident's bf16 index-K + HiCache
interaction is found as the pair, and a delta without a culprit ends "not reproduced".

CMD (tests/support/bisect_url_for.py) starts a double per probe from the probe spec's rendered
decode launch; the double leaks by configuration (bf16 index-K with HiCache and no
indexKHiCacheGate: 4.55% of responses at the declared load of 60), so every verdict follows
the configuration, never timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dsv4_operator.cli import main
from dsv4_operator.exit_codes import EXIT_NOT_REPRODUCED, EXIT_OK
from tests.support.builders import Doc, example_doc, with_changes
from tests.support.contract import assert_contract
from tests.support.paths import REPO

URL_FOR = f"{sys.executable} {REPO / 'tests' / 'support' / 'bisect_url_for.py'}"


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """Where the probe specs go; every double CMD started there is stopped afterwards."""
    yield tmp_path
    pids = tmp_path / "probes" / "pids"
    for line in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(line), signal.SIGKILL)  # the double leads its own session


def deployment(tmp_path: Path, name: str, changes: dict[str, object]) -> str:
    doc: Doc = example_doc()
    doc["spec"] = with_changes(doc["spec"], {"guard.canary.sessions": 32, **changes})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def bisect(workdir: Path, good: str, bad: str, *extra: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `dsv4 bisect --url-for` with two probes at once."""
    result = CliRunner().invoke(
        main,
        [
            "bisect", "--good", good, "--bad", bad, "--url-for", URL_FOR, "--parallel", "2",
            "--budget", "30", "--workdir", str(workdir / "probes"), *extra,
        ],
    )  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


def test_the_bf16_and_hicache_interaction_is_found_as_the_pair(workdir: Path) -> None:
    good = deployment(workdir, "good", {})
    bad = deployment(
        workdir,
        "bad",
        {
            "engine.indexKDtype": "bf16",
            "engine.hicache.enabled": True,
            "engine.extraArgs": ["--chunked-prefill-size", "4096"],
            "engine.env": [{"name": "SGLANG_ENABLE_JIT_DEEPGEMM", "value": "0"}],
            "safety.acknowledge": ["DSV4-R001"],
        },
    )
    code, out, _ = bisect(workdir, good, bad)
    assert code == EXIT_OK, out
    assert "answer: culprit found" in out
    culprits = sorted(line.strip() for line in out.splitlines() if "culprit:" in line)
    assert culprits == [
        "culprit: spec.engine.hicache.enabled: false -> true",
        "culprit: spec.engine.indexKDtype: fp8 -> bf16",
    ], out
    assert "p1 reproduce" in out and "FAIL" in out and "PASS" in out


def test_a_delta_without_a_culprit_is_not_reproduced_and_blames_nothing(workdir: Path) -> None:
    good = deployment(workdir, "good", {})
    bad = deployment(
        workdir,
        "bad",
        {
            "engine.extraArgs": ["--chunked-prefill-size", "4096"],
            "engine.hicache.enabled": True,  # safe with fp8 index-K
        },
    )
    code, out, err = bisect(workdir, good, bad, "-o", "json")
    assert code == EXIT_NOT_REPRODUCED, err
    payload = json.loads(out)
    assert_contract("bisect", payload)
    assert payload["answer"]["reason"] == "notReproduced"
    assert payload["answer"]["culprit"] == []
    reproduce = payload["search"]["probes"][0]
    assert (reproduce["purpose"], reproduce["outcome"]) == ("reproduce", "pass")
    assert reproduce["evidence"]["leaks"] == 0 and reproduce["evidence"]["responses"] > 0
    assert "p1 reproduce" in err  # the probes' lines go to stderr with -o json
