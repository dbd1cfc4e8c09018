"""The LM leader election tells a lost race from a refusal (``runtime.election``):
a standby whose leader queue the broker refuses (a full ``max-queues``, a permission)
backs off and says why, and never takes it for "another process leads"."""

from __future__ import annotations

import aiormq

from runtime.election import Election, Outcome, classify

LOCKED = aiormq.exceptions.ChannelLockedResource("RESOURCE_LOCKED - cannot obtain exclusive access")
FULL = aiormq.exceptions.ChannelPreconditionFailed(
    "PRECONDITION_FAILED - cannot declare queue 'f.lm.lm0.leader': queue limit in vhost 'f' (9) is reached"
)
DENIED = aiormq.exceptions.ChannelAccessRefused("ACCESS_REFUSED - access to queue refused")


def test_each_answer_has_its_outcome() -> None:
    assert classify(None) is Outcome.LEADS
    assert classify(LOCKED) is Outcome.LOST
    assert classify(FULL) is Outcome.REFUSED
    assert classify(DENIED) is Outcome.REFUSED
    assert classify(ConnectionError("gone")) is Outcome.UNREACHABLE


def test_refusals_back_off_and_are_reported_a_lost_race_does_not() -> None:
    e = Election("lm0", period_s=0.15, max_backoff_s=1.0)
    assert e.tried(LOCKED) == (Outcome.LOST, 0.15)
    waits = [e.tried(FULL)[1] for _ in range(5)]
    assert waits == [0.15, 0.3, 0.6, 1.0, 1.0]
    assert "queue limit" in e.last_refusal
    assert e.tried(LOCKED) == (Outcome.LOST, 0.15)  # the broker took it again: anew
    assert e.tried(DENIED)[1] == 0.15
    assert e.tried(None) == (Outcome.LEADS, 0.15)
    assert e.page()["attempts"] == {"leads": 1, "lost_race": 2, "refused": 6, "unreachable": 0}
