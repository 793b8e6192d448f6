"""Which revision the responses read from the leak taps belong to (guard/taps.py, pure): the
one that served alone at both reads with no change between; a rollout between two reads, even
one shorter than the interval, charges its responses to no revision."""

from __future__ import annotations

from dsv4_operator.guard.taps import Serving, ServingLog, TrafficDeltas, attribute

KEY = ("ns", "d")


def test_a_revision_serving_alone_between_two_reads_gets_what_was_read() -> None:
    log = ServingLog()
    assert not log.saw(KEY, "a")  # the first sighting is no change
    first = log.now(KEY)
    assert not log.saw(KEY, "a")
    assert attribute(first, log.now(KEY)) == "a"


def test_a_rollout_shorter_than_the_interval_charges_no_revision() -> None:
    log = ServingLog()
    log.saw(KEY, "a")
    read = log.now(KEY)
    assert log.saw(KEY, None)  # the rollout begins: a change, read the taps now
    assert log.saw(KEY, "b")  # and ends before the next read
    assert attribute(read, log.now(KEY)) is None


def test_a_rollout_there_and_back_between_reads_charges_no_revision() -> None:
    log = ServingLog()
    log.saw(KEY, "a")
    read = log.now(KEY)
    log.saw(KEY, None)
    log.saw(KEY, "a")  # rolled back: the same revision, but another one served meanwhile
    assert log.now(KEY) == Serving("a", 2)
    assert attribute(read, log.now(KEY)) is None


def test_nothing_is_charged_during_a_rollout_or_before_a_first_read() -> None:
    log = ServingLog()
    log.saw(KEY, None)
    assert attribute(log.now(KEY), log.now(KEY)) is None
    log.saw(KEY, "a")
    assert attribute(None, log.now(KEY)) is None
    log.forget(KEY)
    assert log.now(KEY) is None


def test_reads_at_each_change_give_each_revision_only_its_own_responses() -> None:
    """A tap counting responses; A answers 10, a rollout to B shorter than the interval (the
    guard reads at each change, the watch's), B answers 7: B is charged 7, A 10 or less, and
    none of A's go to B."""
    log, deltas = ServingLog(), TrafficDeltas()
    charged: dict[str | None, float] = {}
    count = 0.0
    read_at: Serving | None = None

    def read() -> None:
        nonlocal read_at
        new = deltas.advance((KEY, "tap"), {"ok": count})
        revision = attribute(read_at, log.now(KEY))
        read_at = log.now(KEY)
        charged[revision] = charged.get(revision, 0) + sum(new.values())

    log.saw(KEY, "a")
    read()  # the baseline
    count += 10  # A answers
    for served in (None, "b"):  # the rollout, shorter than the interval
        if log.saw(KEY, served):
            read()
    count += 7  # B answers
    read()  # the interval's read
    assert charged.get("b") == 7
    assert charged.get("a", 0) + charged.get(None, 0) == 10
