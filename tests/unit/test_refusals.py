"""A read the operator's RBAC refused is not asked again in that namespace for the retry
period, and is asked again after it (reconcile/refusals.py): a grant added later takes effect
without a restart, and one namespace's refusal says nothing of another's."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from dsv4_operator.reconcile.refusals import RETRY_SECONDS, Refusals

T0 = datetime(2026, 12, 5, 16, 0, tzinfo=UTC)


class _Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def test_a_refused_read_holds_for_the_retry_period_then_is_asked_again() -> None:
    clock = _Clock()
    refusals = Refusals(clock)
    assert not refusals.holds("list Events", "team-a")  # never refused: asked
    refusals.refused("list Events", "team-a", "meanwhile")
    clock.now = T0 + timedelta(seconds=RETRY_SECONDS - 1)
    assert refusals.holds("list Events", "team-a")
    clock.now = T0 + timedelta(seconds=RETRY_SECONDS)
    assert not refusals.holds("list Events", "team-a")  # due: asked again
    # Asked again and granted now: nothing holds it any more.
    clock.now += timedelta(seconds=1)
    assert not refusals.holds("list Events", "team-a")


def test_a_refusal_holds_only_for_its_read_and_its_namespace() -> None:
    refusals = Refusals(_Clock(), retry_seconds=60)
    refusals.refused("list Events", "team-a", "meanwhile")
    assert refusals.holds("list Events", "team-a")
    assert not refusals.holds("list Events", "team-b")
    assert not refusals.holds("get Secrets", "team-a")


def test_a_read_refused_again_holds_from_the_new_refusal() -> None:
    clock = _Clock()
    refusals = Refusals(clock, retry_seconds=60)
    refusals.refused("get Secrets", "team-a", "meanwhile")
    clock.now = T0 + timedelta(seconds=60)
    assert not refusals.holds("get Secrets", "team-a")
    refusals.refused("get Secrets", "team-a", "meanwhile")  # still refused when asked again
    clock.now = T0 + timedelta(seconds=119)
    assert refusals.holds("get Secrets", "team-a")
    clock.now = T0 + timedelta(seconds=120)
    assert not refusals.holds("get Secrets", "team-a")


def test_a_refusal_is_logged_with_its_namespace_what_happens_meanwhile_and_when_it_is_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusals = Refusals(_Clock())
    with caplog.at_level(logging.WARNING):
        refusals.refused("list Events", "team-a", "pod causes come from pod status only")
    assert caplog.messages == [
        "cannot list Events (RBAC) in namespace team-a: pod causes come from pod status only; "
        "asking again in 600s"
    ]
