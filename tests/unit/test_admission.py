"""The admission handler's checks (rules, the children's dry run, warnings) and its log."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import yaml

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.handlers.admission import check
from dsv4_operator.kube.errors import Forbidden
from dsv4_operator.runtime.logs import AdmissionDenials
from dsv4_operator.trust import Placement
from tests.support.paths import EXAMPLE

WHERE = Placement("dsv4-flash", "llm")


def _spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec["engine"].update(changes)
    return spec


async def _refuses_decode(name: str, namespace: str, spec: DSV4DeploymentSpec) -> list[str]:
    return [f"StatefulSet {name}-decode: spec.replicas: at most 2 here"]


async def _unreachable(name: str, namespace: str, spec: DSV4DeploymentSpec) -> list[str]:
    raise Forbidden(403, "Forbidden", "cannot create statefulsets")


async def test_a_refused_child_refuses_the_spec() -> None:
    errors, _ = await check(_spec(), WHERE, dry_run=_refuses_decode)
    assert errors == [
        "spec: renders StatefulSet dsv4-flash-decode: spec.replicas: at most 2 here "
        "(the API server refuses it)"
    ]


async def test_rule_errors_come_first_and_skip_the_dry_run() -> None:
    calls: list[str] = []

    async def counting(name: str, namespace: str, spec: DSV4DeploymentSpec) -> list[str]:
        calls.append(name)
        return []

    errors, _ = await check(
        _spec(indexKDtype="bf16", overlap={"multiStream": True}), WHERE, dry_run=counting
    )
    assert any("DSV4-R002" in e for e in errors) and calls == []


async def test_a_dry_run_that_cannot_be_made_admits_on_the_rules(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        errors, _ = await check(_spec(), WHERE, dry_run=_unreachable)
    assert errors == []
    assert "admitted on the rules alone" in caplog.text and "cannot create" in caplog.text


async def test_warnings_are_returned_for_kubectl() -> None:
    errors, warnings = await check(_spec(maxRunningRequests=128), WHERE)
    assert errors == []
    assert [w for w in warnings if w.startswith("spec.engine.maxRunningRequests: [DSV4-R006]")]


def test_a_denial_is_logged_at_info_other_errors_unchanged() -> None:
    denial = logging.LogRecord(
        "kopf.objects",
        logging.ERROR,
        __file__,
        1,
        "Webhook 'rules' failed permanently: spec.engine.hicache.enabled: [DSV4-R001] no",
        None,
        None,
    )
    other = logging.LogRecord(
        "kopf.objects",
        logging.ERROR,
        __file__,
        1,
        "Handler 'x' failed permanently: boom",
        None,
        None,
    )
    assert AdmissionDenials().filter(denial) and AdmissionDenials().filter(other)
    assert (denial.levelname, denial.getMessage()) == (
        "INFO",
        "admission denied: spec.engine.hicache.enabled: [DSV4-R001] no",
    )
    assert other.levelname == "ERROR"


class _Connection:
    """What aiohttp's StreamReader asks of a connection: flow control, never needed here."""

    def pause_reading(self, **_: Any) -> None: ...

    def resume_reading(self, **_: Any) -> None: ...


def _review(body: str) -> Any:
    """A POST to the webhook, in process: the request object aiohttp's server would hand over."""
    import asyncio

    from aiohttp.streams import StreamReader
    from aiohttp.test_utils import make_mocked_request

    payload = StreamReader(_Connection(), 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    payload.feed_data(body.encode())
    payload.feed_eof()
    return make_mocked_request("POST", "/rules", payload=payload)


async def test_the_webhook_answers_400_to_an_integer_json_cannot_hold() -> None:
    import aiohttp.web

    from dsv4_operator.runtime.webhook import AdmissionServer

    async def review(data: Any, **_: Any) -> Any:
        raise AssertionError("the handler never sees a body that could not be read")

    body = '{"request": {"object": {"spec": {"decode": {"replicas": ' + "9" * 5000 + "}}}}}"
    with pytest.raises(aiohttp.web.HTTPBadRequest) as refused:
        await AdmissionServer._serve(review, _review(body))
    assert refused.value.reason.startswith("the AdmissionReview is not JSON this webhook reads")
    assert "4300 digits" in refused.value.reason and "set_int_max_str_digits" not in (
        refused.value.reason
    )
    with pytest.raises(aiohttp.web.HTTPBadRequest):  # kopf's own answer to broken JSON stays
        await AdmissionServer._serve(review, _review('{"request": '))


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b", "\x7f", "\ufffe"])
async def test_control_characters_are_findings_not_crashes(char: str) -> None:
    # JSON carries any character: the webhook may be handed what YAML would refuse.
    spec = _spec()
    spec["engine"]["extraArgs"] = [f"--log-level{char}"]
    errors, _ = await check(spec, Placement(f"dsv4{char}flash", "llm"))
    assert any(e.startswith("metadata.name: [schema]") for e in errors), errors
    assert any(e.startswith("spec.engine.extraArgs") for e in errors), errors
