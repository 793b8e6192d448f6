"""`dsv4 selftest` against an API server that is not there (a closed loopback port): a failed
check in the JSON contract, not a crash. Its judgements, in process: tests/unit/test_selftest.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dsv4_operator.cli import main
from tests.support.contract import assert_contract


def test_an_unreachable_api_server_is_a_failed_check_in_the_json_contract(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    args = ["selftest", "--namespace", "ops", "--deployment", "op", "--lease", "op"]
    args += ["--target-namespace", "work", "--kubeconfig", str(kubeconfig), "-o", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    assert_contract("selftest", payload)
    assert payload["passed"] is False
    assert [c["name"] for c in payload["checks"]] == ["apiServer"]
    assert payload["checks"][0]["reason"] == "Unreachable"
