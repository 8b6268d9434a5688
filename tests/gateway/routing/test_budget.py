"""Retry budget on a fake clock."""

from __future__ import annotations

from gateway.routing.budget import CauseBudget, RetryBudget


def test_floor_allows_a_few_retries_without_traffic() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=1.0, window=10.0)
    assert sum(budget.withdraw(100.0) for _ in range(20)) == 10


def test_ratio_caps_retries_under_brownout() -> None:
    budget = RetryBudget(ratio=0.2, min_per_second=0.0, window=10.0)
    now = 1000.0
    granted = 0
    for i in range(1000):
        t = now + i * 0.005  # 1000 requests in 5 s, every one failing
        budget.deposit(t)
        granted += budget.withdraw(t)
    assert granted == 200


def test_window_forgets_old_traffic() -> None:
    budget = RetryBudget(ratio=0.5, min_per_second=0.0, window=10.0)
    for _ in range(100):
        budget.deposit(0.0)
    assert budget.available(0.0) == 50
    assert budget.available(5.0) == 50
    assert budget.available(10.5) == 0
    assert not budget.withdraw(10.5)


def test_spent_retries_expire_too() -> None:
    budget = RetryBudget(ratio=0.0, min_per_second=0.5, window=10.0)
    assert sum(budget.withdraw(0.0) for _ in range(10)) == 5
    assert not budget.withdraw(9.0)
    assert budget.withdraw(11.0)


def test_big_clock_jump_resets() -> None:
    budget = RetryBudget(ratio=1.0, min_per_second=0.0, window=10.0)
    budget.deposit(0.0)
    assert budget.available(1e6) == 0


def test_resumptions_are_paid_once_per_cause() -> None:
    budget = RetryBudget(ratio=0.0, min_per_second=0.2, window=10.0)  # 2 retries in all
    causes = CauseBudget(budget, window=1.0)
    # A leader dies: 500 of its streams break within the same second, one payment for all.
    assert all(causes.withdraw(("u0", "reset"), 100.0 + i / 1000) for i in range(500))
    assert budget.available(100.5) == 1.0
    assert causes.withdraw(("u1", "reset"), 100.5)  # another cause pays its own
    # The budget is spent: a third cause is refused, and so are all streams it broke.
    assert not causes.withdraw(("u2", "unit_error"), 100.6)
    assert not causes.withdraw(("u2", "unit_error"), 100.7)
    assert causes.withdraw(("u0", "reset"), 100.9)  # still the first cause's window
    assert not causes.withdraw(("u0", "reset"), 101.2)  # later: a new episode, unpaid
