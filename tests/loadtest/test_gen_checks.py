"""The pass/fail checks and the target options, as pure functions: parsing and judging."""

from __future__ import annotations

import pytest

from loadtest.gen.checks import CheckError, checks_section, judge, max_error_rate, parse_slo
from loadtest.gen.target import build_headers, choose_model, parse_header


def _summary(**over: object) -> dict[str, object]:
    dist = {"count": 3, "mean": 150.0, "p50": 100.0, "p90": 200.0, "p99": 300.0, "max": 300.0}
    base: dict[str, object] = {"requests": 10, "failed": 1, "ttft_ms": dist, "e2e_ms": dist}
    empty = {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    base.update(itl_ms=empty, tpot_ms=empty)
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("text", "metric", "limit"),
    [
        ("ttft_p99=2s", "ttft_p99", 2000.0),
        ("ttft_p50=250ms", "ttft_p50", 250.0),
        ("TTFT_P90 = 1.5s", "ttft_p90", 1500.0),
        ("itl_p99=40ms", "itl_p99", 40.0),
        ("duration_p50=3s", "e2e_p50", 3000.0),
        ("e2e_max=10s", "e2e_max", 10000.0),
        ("tpot_mean=20ms", "tpot_mean", 20.0),
        ("error_rate=0.01", "error_rate", 0.01),
        ("error_rate=5%", "error_rate", 0.05),
    ],
)
def test_slo_forms_parse(text: str, metric: str, limit: float) -> None:
    check = parse_slo(text)
    assert check.metric == metric and check.limit == pytest.approx(limit)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("ttft_p99", "expected METRIC=LIMIT"),
        ("ttft_p99=2", "a duration such as 2s or 250ms"),
        ("ttft_p99=fast s", "'fast' is not a number"),
        ("ttft_p99=-1s", "a duration"),
        ("ttft_p42=1s", "unknown metric 'ttft_p42'"),
        ("latency_p99=1s", "unknown metric"),
        ("error_rate=2", "fraction within [0, 1]"),
        ("error_rate=150%", "fraction within [0, 1]"),
        ("ttft_p99=infs", "finite"),
    ],
)
def test_a_bad_slo_names_the_flag_and_value(text: str, needle: str) -> None:
    with pytest.raises(CheckError) as caught:
        parse_slo(text)
    assert f"--slo {text!r}" in str(caught.value) and needle in str(caught.value)


def test_latency_checks_pass_at_the_limit_and_fail_above_it() -> None:
    checks = [parse_slo("ttft_p99=300ms"), parse_slo("ttft_p50=99ms"), parse_slo("e2e_p90=1s")]
    verdicts = judge(checks, _summary())
    assert [v.passed for v in verdicts] == [True, False, True]
    assert verdicts[1].observed == 100.0
    assert verdicts[1].detail == "ttft_p50 100.0 ms > 99 ms"
    text = checks_section(verdicts)
    assert "FAIL  ttft_p50 100.0 ms > 99 ms  (--slo ttft_p50=99ms)" in text
    assert text.endswith("checks: 1 of 3 failed")


def test_a_latency_check_without_samples_fails() -> None:
    (verdict,) = judge([parse_slo("itl_p99=1s")], _summary())
    assert not verdict.passed and "no samples" in verdict.detail


def test_error_rate_checks() -> None:
    assert judge([max_error_rate(0.1)], _summary())[0].passed  # 1 of 10 is not above 0.1
    (strict,) = judge([max_error_rate(0.0)], _summary())
    assert not strict.passed and strict.detail == "error_rate 0.1 (1 of 10 failed) > 0"
    (all_failed,) = judge([parse_slo("error_rate=99%")], _summary(failed=10))
    assert not all_failed.passed and all_failed.observed == 1.0
    (nothing,) = judge([max_error_rate(1.0)], _summary(requests=0, failed=0))
    assert not nothing.passed and "no requests" in nothing.detail
    assert checks_section([strict]).endswith("checks: 1 of 1 failed")
    with pytest.raises(CheckError, match="--max-error-rate"):
        max_error_rate(1.5)


def test_verdicts_serialise_for_result_json() -> None:
    (verdict,) = judge([parse_slo("ttft_p99=2s")], _summary())
    assert verdict.to_json() == {
        "check": "--slo ttft_p99=2s",
        "metric": "ttft_p99",
        "limit": 2000.0,
        "observed": 300.0,
        "passed": True,
        "detail": "ttft_p99 300.0 ms <= 2000 ms",
    }


def test_headers_and_api_key() -> None:
    assert parse_header("X-Team:  load test ") == ("X-Team", "load test")
    assert parse_header("X-Empty:") == ("X-Empty", "")
    for bad in ("no colon", "bad name: x", ": x"):
        with pytest.raises(ValueError, match="expected 'Name: value'"):
            parse_header(bad)
    env = {"UNITGATE_API_KEY": "from-env", "OPENAI_API_KEY": "personal"}
    assert build_headers(["A: 1"], "k", env) == (("Authorization", "Bearer k"), ("A", "1"))
    assert build_headers([], None, env) == (("Authorization", "Bearer from-env"),)
    assert build_headers([], None, {"OPENAI_API_KEY": "personal"}) == ()  # never sent
    with pytest.raises(ValueError, match="Authorization --header"):
        build_headers(["authorization: Basic x"], "k", {})
    assert build_headers(["Authorization: Basic x"], None, {}) == (("Authorization", "Basic x"),)


def test_model_choice() -> None:
    assert choose_model(["only"]) == ("only", "model: only (the one listed at /v1/models)")
    model, why = choose_model(["a", "b", "c"])
    assert model == "a" and "the first of 3" in why and "a, b, c" in why and "--model" in why
