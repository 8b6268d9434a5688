"""Retry budget on a fake clock."""

from __future__ import annotations

from gateway.routing.budget import RetryBudget


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
