"""Which tenants get a label of their own: heavy hitters, at most `top`, sticky once given."""

from __future__ import annotations

from gateway.observability.tenant_labels import MIN_REQUESTS, OTHER, TenantLabels


def feed(labels: TenantLabels, tenants: list[str], rounds: int) -> list[str]:
    return [labels.observe(t) for _ in range(rounds) for t in tenants]


def test_a_heavy_tenant_is_promoted_after_min_requests_and_keeps_its_label() -> None:
    labels = TenantLabels(top=3)
    got = feed(labels, ["big"], MIN_REQUESTS)
    assert got[:-1] == [OTHER] * (MIN_REQUESTS - 1) and got[-1] == "big"
    assert labels.label("big") == "big" and labels.labelled == {"big"}
    # sticky: however quiet it gets, later requests keep the label
    feed(labels, [f"t{i}" for i in range(200)], 5)
    assert labels.observe("big") == "big"


def test_one_off_tenants_stay_other() -> None:
    labels = TenantLabels(top=5)
    assert set(feed(labels, [f"t{i}" for i in range(500)], 1)) == {OTHER}
    assert labels.labelled == frozenset()


def test_many_equal_small_tenants_earn_no_label_a_share_does() -> None:
    labels = TenantLabels(top=2)  # share 1/4
    feed(labels, [f"t{i}" for i in range(10)], 30)  # each a tenth of the traffic
    assert labels.labelled == frozenset()
    feed(labels, ["big"] * 5 + [f"t{i}" for i in range(5)], 40)  # half the traffic lately
    assert labels.labelled == {"big"}


def test_at_most_top_labels_then_everyone_else_is_other() -> None:
    labels = TenantLabels(top=2)
    feed(labels, ["a", "b", "c"], 50)  # each a third: above the 1/4 share
    assert len(labels.labelled) == 2
    late = ({"a", "b", "c"} - labels.labelled).pop()
    assert labels.observe(late) == OTHER
    feed(labels, ["d"], 1000)  # a late heavy hitter: the labels ran out
    assert labels.label("d") == OTHER


def test_top_zero_labels_nobody() -> None:
    labels = TenantLabels(top=0)
    assert set(feed(labels, ["a"], 100)) == {OTHER}


def test_decay_lets_a_tenant_that_grows_late_be_noticed() -> None:
    labels = TenantLabels(top=4, decay_every=200)  # share 1/8
    feed(labels, [f"t{i}" for i in range(20)], 500)  # 10,000 requests, none heavy
    assert labels.labelled == frozenset()
    feed(labels, ["late"] + [f"t{i}" for i in range(4)], 100)  # a fifth of recent traffic
    assert "late" in labels.labelled


def test_a_newcomer_inherits_no_credit_from_the_counter_it_takes_over() -> None:
    labels = TenantLabels(top=4, share=0.01)  # a sketch of 16 counters
    feed(labels, [f"t{i}" for i in range(16)], 20)  # every counter at 20
    # a newcomer's counter starts at 21, but it is guaranteed only its own one request
    assert labels.observe("new") == OTHER


def test_a_tenant_named_other_takes_no_label_of_the_top() -> None:
    labels = TenantLabels(top=1)
    feed(labels, [OTHER], 50)
    assert labels.labelled == frozenset()
    assert feed(labels, ["real"], MIN_REQUESTS)[-1] == "real"
