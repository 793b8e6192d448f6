"""`dsv4 selftest`, what `helm test` runs: the operator is up and leads, its webhook admits a
sound spec and refuses an unsafe one (server-side dry runs: nothing is stored).

Facts are gathered first, then a chain of pure judgements each returns an `InstallationCheck`
with a reason and a message; the command prints them and exits 1 when any failed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import click

from dsv4_operator.exit_codes import EXIT_CHECK_FAILED, EXIT_OK, with_exit_codes
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Forbidden, KubeError, Unreachable
from dsv4_operator.kube.objects import Obj
from dsv4_operator.kube.resources import DEPLOYMENT, LEASE
from dsv4_operator.names import API_VERSION, KIND

# The DSV4-R001 hazard: bf16 index-K read while HiCache streams layers in; always refused.
UNSAFE_ENGINE = {
    "indexKDtype": "bf16",
    "capabilities": ["bf16IndexK"],
    "hicache": {"enabled": True},
}
UNSAFE_RULE = "DSV4-R001"
# A rolling update's last old replica releases the Lease as it stops, and a standby takes it
# within its retry period; `helm test` right after `rollout status` can read the Lease in
# between. A Lease no replica holds is read again, a second apart, this long before the check
# fails (also on a fresh install, before the first replica has taken it).
LEADER_WAIT_SECONDS = 30.0
LEADER_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class InstallationCheck:
    """One judgement: `reason` is CamelCase (`Admitted`, `WebhookCallFailed`, ...)."""

    name: str
    ok: bool
    reason: str
    message: str


def spec_document(name: str, namespace: str, image: str, unsafe: bool = False) -> Obj:
    """A minimal DSV4Deployment the rules accept (or, `unsafe`, one they must refuse)."""
    engine: Obj = {"image": image, "sglangVersion": "0.5.16"}
    if unsafe:
        engine.update(UNSAFE_ENGINE)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {
                "name": "deepseek-ai/DeepSeek-V4-Flash",
                "cache": {"pvc": {"claimName": f"{name}-weights"}},
            },
            "engine": engine,
            "gpu": {"product": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"},
        },
    }


def judge_deployment(name: str, obj: Obj | None) -> InstallationCheck:
    if obj is None:
        return InstallationCheck(
            "operator", False, "OperatorMissing", f"Deployment {name} not found"
        )
    available = int((obj.get("status") or {}).get("availableReplicas") or 0)
    wanted = int((obj.get("spec") or {}).get("replicas") or 0)
    if available < 1:
        return InstallationCheck(
            "operator", False, "OperatorUnavailable", f"Deployment {name}: 0 of {wanted} available"
        )
    return InstallationCheck(
        "operator", True, "Available", f"Deployment {name}: {available}/{wanted} available"
    )


def judge_lease(name: str, obj: Obj | None, now: dt.datetime) -> InstallationCheck:
    """A leader holds the Lease and renewed it within its duration."""
    if obj is None:
        return InstallationCheck(
            "leader", False, "NoLease", f"Lease {name} not found: no replica ever led"
        )
    spec = obj.get("spec") or {}
    holder, renewed = spec.get("holderIdentity"), spec.get("renewTime")
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if not holder or not renewed:
        return InstallationCheck("leader", False, "NoLeader", f"Lease {name} is held by no replica")
    age = (now - dt.datetime.fromisoformat(renewed.replace("Z", "+00:00"))).total_seconds()
    if age > duration:
        return InstallationCheck(
            "leader",
            False,
            "LeaseExpired",
            f"Lease {name}: {holder} last renewed {age:.0f}s ago (duration {duration:g}s)",
        )
    return InstallationCheck("leader", True, "Leading", f"{holder} leads (renewed {age:.0f}s ago)")


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def await_leader(
    client: KubeClient,
    namespace: str,
    lease: str,
    clock: Callable[[], dt.datetime],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    wait: float = LEADER_WAIT_SECONDS,
) -> InstallationCheck:
    """`judge_lease` until a replica leads or `wait` seconds of reading again have passed."""
    waited = 0.0
    while True:
        check = judge_lease(lease, await client.get(LEASE, namespace, lease), clock())
        if check.ok or waited >= wait:
            break
        await sleep(LEADER_POLL_SECONDS)
        waited += LEADER_POLL_SECONDS
    if check.ok or not waited:
        return check
    return InstallationCheck(
        check.name, False, check.reason, f"{check.message} (read again for {waited:.0f}s)"
    )


def _webhook_failed(error: KubeError) -> bool:
    return "failed calling webhook" in error.message


def judge_sound(error: KubeError | None) -> InstallationCheck:
    if error is None:
        return InstallationCheck(
            "admitsSound", True, "Admitted", "a sound spec is admitted (dry run)"
        )
    if _webhook_failed(error):
        return InstallationCheck("admitsSound", False, "WebhookCallFailed", error.message)
    if isinstance(error, Forbidden):  # the test's own RBAC, not the webhook
        return InstallationCheck("admitsSound", False, "Forbidden", error.message)
    return InstallationCheck(
        "admitsSound", False, "SoundRefused", f"{error.status} {error.message}"
    )


def judge_unsafe(error: KubeError | None) -> InstallationCheck:
    if error is None:
        return InstallationCheck(
            "refusesUnsafe",
            False,
            "UnsafeAdmitted",
            f"a spec that breaks {UNSAFE_RULE} was admitted: the webhook is not called or "
            "ignored (webhook.enabled, failurePolicy, namespaceSelector)",
        )
    if UNSAFE_RULE in error.message:
        return InstallationCheck(
            "refusesUnsafe", True, "Refused", f"refused by the rules ({UNSAFE_RULE})"
        )
    if _webhook_failed(error):
        return InstallationCheck("refusesUnsafe", False, "WebhookCallFailed", error.message)
    return InstallationCheck(
        "refusesUnsafe", False, "RefusedElsewhere", f"refused, not by the rules: {error.message}"
    )


async def _dry_run(client: KubeClient, doc: Obj) -> KubeError | None:
    try:
        await client.dry_run_create(doc)
    except KubeError as error:
        return error
    return None


async def run_checks(
    client: KubeClient,
    namespace: str,
    deployment: str,
    lease: str,
    target: str,
    image: str,
    webhook: bool = True,
    leader_wait: float = LEADER_WAIT_SECONDS,
) -> list[InstallationCheck]:
    """Gather the facts (reads and dry runs), then judge them (without the webhook, nothing
    refuses an unsafe spec at admission, so that check is left out)."""
    checks = [judge_deployment(deployment, await client.get(DEPLOYMENT, namespace, deployment))]
    if lease:
        checks.append(await await_leader(client, namespace, lease, _utc_now, wait=leader_wait))
    name = f"dsv4-selftest-{secrets.token_hex(3)}"
    checks.append(judge_sound(await _dry_run(client, spec_document(name, target, image))))
    if webhook:
        unsafe = spec_document(name, target, image, unsafe=True)
        checks.append(judge_unsafe(await _dry_run(client, unsafe)))
    return checks


def _api_reason(error: KubeError) -> str:
    if isinstance(error, Unreachable):
        return "Unreachable"
    return "Forbidden" if isinstance(error, Forbidden) else "ApiError"


async def _checks(kubeconfig: str | None, **kwargs: Any) -> list[InstallationCheck]:
    client = KubeClient.from_environment(kubeconfig, field_manager="dsv4-selftest")
    try:
        return await run_checks(client, **kwargs)
    finally:
        await client.close()


@click.command(
    "selftest",
    help=with_exit_codes("selftest", "Check a running installation, as `helm test` does."),
)
@click.option("--namespace", required=True, help="The operator's namespace (Deployment, Lease).")
@click.option("--deployment", required=True, help="The operator's Deployment.")
@click.option("--lease", default="", help="The leader-election Lease (empty: not checked).")
@click.option(
    "--target-namespace", required=True, help="A namespace the webhook covers (dry runs only)."
)
@click.option(
    "--engine-image",
    default="registry.example.com/dsv4-engine:0.5.16-p3",
    show_default=True,
    help="The engine image of the sound spec (one your trust settings allow).",
)
@click.option(
    "--webhook/--no-webhook",
    default=True,
    show_default=True,
    help="Whether the installation runs the admission webhook (--no-webhook: the check that it "
    "refuses an unsafe spec is left out).",
)
@click.option(
    "--leader-wait",
    type=click.FloatRange(min=0),
    default=LEADER_WAIT_SECONDS,
    show_default=True,
    help="Seconds to read a Lease no replica holds again before the leader check fails (a "
    "rolling update hands it over).",
)
@click.option("--kubeconfig", default=None, help="Default: in-cluster, then KUBECONFIG.")
@click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def selftest_command(
    namespace: str,
    deployment: str,
    lease: str,
    target_namespace: str,
    engine_image: str,
    webhook: bool,
    leader_wait: float,
    kubeconfig: str | None,
    output: str,
) -> None:
    try:
        checks = asyncio.run(
            _checks(
                kubeconfig,
                namespace=namespace,
                deployment=deployment,
                lease=lease,
                target=target_namespace,
                image=engine_image,
                webhook=webhook,
                leader_wait=leader_wait,
            )
        )
    except KubeError as error:  # the reads themselves failed (RBAC, API server down)
        checks = [InstallationCheck("apiServer", False, _api_reason(error), str(error))]
    passed = all(c.ok for c in checks)
    if output == "json":
        payload = {"passed": passed, "checks": [asdict(c) for c in checks]}
        click.echo(json.dumps(payload, indent=2))
    else:
        for c in checks:
            click.echo(f"{'PASS' if c.ok else 'FAIL'} {c.name}: {c.reason}: {c.message}")
    sys.exit(EXIT_OK if passed else EXIT_CHECK_FAILED)
