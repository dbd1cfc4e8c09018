"""A GM holds at most ``limit`` bytes of one user's job deliveries before reading them
(``global_master.backlog``): past it a job is shed as ``user_backlog`` -- never a
redelivered one, which was admitted before and whose tasks may run."""

from __future__ import annotations

from common.ids import UserId
from global_master.backlog import UnreadJobs

U0, U1 = UserId("u0"), UserId("u1")


def test_a_delivery_past_the_users_bound_is_shed_and_held_nothing_for() -> None:
    unread = UnreadJobs(limit=100)
    assert unread.take(U0, 60, redelivered=False) is None
    shed = unread.take(U0, 50, redelivered=False)
    assert shed is not None
    assert "60 bytes" in shed
    assert "pass 100" in shed
    assert unread.waiting(U0) == 60
    assert unread.take(U0, 40, redelivered=False) is None  # up to the bound is held
    assert unread.waiting(U0) == 100
    assert unread.take(U1, 100, redelivered=False) is None  # each user its own bound


def test_one_job_is_always_read_whatever_its_size() -> None:
    unread = UnreadJobs(limit=100)
    assert unread.take(U0, 250, redelivered=False) is None  # (max_body refuses it later)
    assert unread.take(U0, 1, redelivered=False) is not None
    unread.done(U0, 250)
    assert unread.take(U0, 1, redelivered=False) is None


def test_a_redelivered_job_is_never_shed() -> None:
    """After a GM restart the broker redelivers every job it held unsettled at once:
    those were admitted before, some of their tasks may run; shedding one would lose
    them."""
    unread = UnreadJobs(limit=100)
    for _ in range(5):
        assert unread.take(U0, 90, redelivered=True) is None
    assert unread.waiting(U0) == 450
    assert unread.peak == 450
    assert unread.take(U0, 90, redelivered=False) is not None  # a new one still is


def test_room_comes_back_as_deliveries_are_read_and_the_peak_stays() -> None:
    unread = UnreadJobs(limit=100)
    unread.take(U0, 70, redelivered=False)
    unread.take(U1, 30, redelivered=False)
    assert unread.total() == 100
    unread.done(U0, 70)
    unread.done(U1, 30)
    assert unread.total() == 0
    assert unread.waiting(U0) == 0
    assert unread.peak == 70
    assert unread.take(U0, 100, redelivered=False) is None


def test_an_empty_delivery_balances_like_any_other() -> None:
    """An empty body is a delivery too: read after another of its user's, it must still
    find its own entry (it raised KeyError, which hid the body's own refusal)."""
    unread = UnreadJobs(limit=100)
    unread.take(U0, 10, redelivered=False)
    unread.take(U0, 0, redelivered=False)
    unread.take(U1, 0, redelivered=False)
    unread.take(U1, 0, redelivered=False)
    unread.done(U0, 10)
    unread.done(U0, 0)
    unread.done(U1, 0)
    unread.done(U1, 0)
    assert unread.total() == 0
    assert unread.take(U0, 100, redelivered=False) is None
