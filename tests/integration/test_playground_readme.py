"""The README's install section, run as written on the playground (`make playground`): its
commands between the `readme-install` markers, then the day-2 walk between `readme-day2`,
each line in a shell with the environment the playground's printed shell line sets.

Nothing is edited or skipped: the chart installs with its defaults (two replicas, webhook and
leader election on), the operator's replicas, the weights Job, the router, the tap and
`helm test`'s pod run as processes in pod network namespaces, the engines are the engine
double (the one stand-in), the weights come from the stand-in Hub into a volume the
playground's provisioner made for the claim of the default StorageClass.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dsv4_devcluster import wait_for
from dsv4_devcluster.playground import Playground
from tests.support.paths import REPO

pytestmark = pytest.mark.integration
README = (REPO / "README.md").read_text()
COMMAND_TIMEOUT = 240
POST = (
    "import sys, urllib.request as u; print(u.urlopen(u.Request(sys.argv[1], sys.argv[2]"
    ".encode(), {'Content-Type': 'application/json'}), timeout=30).read().decode())"
)


def readme_commands(marker: str) -> list[str]:
    """The shell commands of the README's block between `<!-- marker:begin/end -->`: comments
    dropped, backslash-continued lines joined."""
    match = re.search(
        rf"<!-- {marker}:begin -->\n```bash\n(.*?)```\n<!-- {marker}:end -->", README, re.S
    )
    assert match, f"README.md has no ```bash block between the {marker} markers"
    joined = match.group(1).replace("\\\n", " ")
    commands = [line.strip() for line in joined.splitlines()]
    return [c for c in commands if c and not c.startswith("#")]


def test_the_readme_blocks_are_found_and_hold_the_documented_steps() -> None:
    install, day2 = readme_commands("readme-install"), readme_commands("readme-day2")
    assert install[0].startswith("helm install dsv4-operator charts/dsv4-operator")
    assert "--set webhook.enabled=false" not in " ".join(install)  # the webhook stays on
    assert "kubectl apply -f examples/dsv4-hub.yaml" in install
    assert any(c.startswith("kubectl describe dsv4") for c in install)
    assert [c.split()[:2] for c in day2] == [
        ["kubectl", "patch"],
        ["helm", "upgrade"],
        ["kubectl", "-n"],
        ["helm", "test"],
        ["helm", "uninstall"],
    ]


@pytest.fixture(scope="module")
def playground() -> Iterator[Playground]:
    lines: list[str] = []
    with Playground(say=lines.append) as pg:
        yield pg
        print("\n".join(lines))
        # Shown with a failure (pytest prints a passing test's output nowhere), so whatever
        # step failed, the state it left is in the report.
        print("the playground at the end:\n" + "\n".join(pg.diagnosis()))


def _shell(pg: Playground, command: str, succeeds: bool = True) -> subprocess.CompletedProcess[str]:
    """`command` run as the README's reader runs it; when it should succeed and does not, the
    playground's state is printed with the failure."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=REPO,
            env=pg.env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"$ {command}  # no exit after {COMMAND_TIMEOUT}s; the playground:")
        print("\n".join(pg.diagnosis()))
        raise
    print(f"$ {command}  # exit {done.returncode}, {time.monotonic() - started:.1f}s")
    print((done.stdout + done.stderr)[-3000:])
    if succeeds and done.returncode != 0:
        print("the playground:\n" + "\n".join(pg.diagnosis()))
    return done


def _get(pg: Playground, *args: str) -> str:
    done = _shell(pg, " ".join(["kubectl", "get", *args, "-o", "name"]))
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.long(seconds=60)
def test_the_readme_install_section_runs_as_written_then_the_day2_walk(
    playground: Playground,
) -> None:
    pg = playground
    for command in readme_commands("readme-install"):
        done = _shell(pg, command)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        if command.startswith("kubectl describe"):
            for condition in ("Ready", "WeightsReady", "PlanVerified"):
                assert re.search(rf"Type:\s+{condition}\b", done.stdout), condition
    assert not (REPO / ".kube").exists(), "kubectl or helm kept a cache in the checkout"
    runner = pg.runner
    assert runner is not None
    kinds: dict[str, Any] = runner.kinds()
    print("\n".join(f"{where}: {kind}" for where, kind in sorted(kinds.items())))
    router = [k for w, k in kinds.items() if w.endswith("/router")]
    engines = [k for w, k in kinds.items() if w.endswith("/engine")]
    assert router == ["real: sglang-router (PyPI wheel)"], kinds
    assert engines == ["stand-in: the engine test double"] * 2, kinds
    assert not runner.unrunnable, runner.unrunnable
    router_pod = next(w.split("/")[1] for w in kinds if w.endswith("/router"))
    tap_log = pg.root / "pods" / f"default_{router_pod}" / "tap.log"
    # A client in the cluster (here: in an operator pod's network) reaches the router Service
    # by name, through the tap and the real router, to the engines.
    operator_pod = sorted(w.split("/")[1] for w in kinds if w.startswith("dsv4-system/"))[0]
    request = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}]}
    # The deployment is Ready once its router pod is; the Service reaches it once the
    # EndpointSlice controller and then the pods' relays have it (on a cluster: kube-proxy).
    # Before that a connection is refused (it failed once so: "Broken pipe").
    wait_for(
        "the router Service's ready endpoint in the pods' relays",
        lambda: runner.service_endpoints("dsv4-flash-router", "default"),
        timeout=30,
    )
    client = runner.command_in_pod(
        "dsv4-system", operator_pod,
        [sys.executable, "-c", POST, "http://dsv4-flash-router.default.svc:8000/v1/chat/completions",
         json.dumps(request)],
    )  # fmt: skip
    answer = subprocess.run(client, capture_output=True, text=True, timeout=60, check=False)
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["model"] == "deepseek-v4-flash"

    unsafe, upgrade, rollout, helm_test, uninstall = readme_commands("readme-day2")
    refused = _shell(pg, unsafe, succeeds=False)
    assert refused.returncode != 0
    assert 'admission webhook "rules.dsv4.io.validation" denied' in refused.stderr
    assert "[DSV4-R001] bf16 index-K with HiCache" in refused.stderr
    for command in (upgrade, rollout, helm_test):
        done = _shell(pg, command)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
    assert re.search(r"Phase:\s+Succeeded", done.stdout), done.stdout  # helm test's pod
    # The guard's canary runs in the router pod's tap, against the real router (the
    # operator's POST /canary, docs/guard.md): the first run comes within an interval (60 s).
    wait_for(
        "a canary run by the router pod's tap",
        lambda: '"POST /canary HTTP/1.1" 200' in tap_log.read_text(),
        timeout=150,
    )
    assert _shell(pg, uninstall).returncode == 0

    # What docs/install.md#uninstall says stays: the CRD, the DSV4Deployment, its engines.
    assert "customresourcedefinition" in _get(pg, "crd", "dsv4deployments.dsv4.io")
    assert _get(pg, "dsv4", "-n", "default").strip() == "dsv4deployment.dsv4.io/dsv4-flash"
    assert "statefulset.apps/dsv4-flash-prefill" in _get(pg, "statefulsets", "-n", "default")
    # ... and what it removes: the operator, its webhook, Services, RBAC, the Lease.
    gone = {
        "deployments": "-n dsv4-system",
        "services": "-n dsv4-system",
        "serviceaccounts": "-n dsv4-system --field-selector metadata.name!=default",
        "leases": "-n dsv4-system",
        "validatingwebhookconfigurations": "",
        "clusterroles": "-l app.kubernetes.io/name=dsv4-operator",
    }

    def left() -> dict[str, str]:
        found = {kind: _get(pg, kind, *where.split()).strip() for kind, where in gone.items()}
        return {kind: names for kind, names in found.items() if names}

    # The garbage collector takes the Lease with the Deployment that owns it.
    wait_for("only what docs/install.md says to stay", lambda: not left(), timeout=60)
