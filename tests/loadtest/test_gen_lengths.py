"""Length distributions: the spec parser, the seeded samples and how the workload uses them."""

from __future__ import annotations

import random
import statistics

import orjson
import pytest

from loadtest.gen import cli
from loadtest.gen.lengths import LengthDist, LengthSpecError, parse_length
from loadtest.gen.workload import Workload, WorkloadConfig

SAMPLES = 4000


@pytest.mark.parametrize(
    ("text", "kind", "spec"),
    [
        ("128", "fixed", "128"),
        (" 7 ", "fixed", "7"),
        ("uniform:64:256", "uniform", "uniform:64:256"),
        ("uniform:5:5", "uniform", "uniform:5:5"),
        ("uniform:1000:2000000", "uniform", "uniform:1000:2000000"),
        ("normal:128:32", "normal", "normal:128:32"),
        ("normal:12.5:0", "normal", "normal:12.5:0"),
        ("normal:3e6:0.125", "normal", "normal:3000000:0.125"),
        ("lognormal:200:150", "lognormal", "lognormal:200:150"),
    ],
)
def test_good_specs_parse_to_their_canonical_form(text: str, kind: str, spec: str) -> None:
    dist = parse_length(text, "--input-len")
    assert (dist.kind, dist.spec) == (kind, spec)
    assert parse_length(dist.spec, "--input-len") == dist  # result.json specs re-parse


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "length must be a whole number"),
        ("0", "length must be >= 1"),
        ("12.5", "length must be a whole number"),
        ("big", "length must be a whole number"),
        ("gamma:1:2", "unknown distribution 'gamma'"),
        ("uniform:5", "uniform takes two numbers"),
        ("normal:1:2:3", "normal takes two numbers"),
        ("uniform:9:3", "MIN must be <= MAX"),
        ("uniform:0:3", "MIN must be >= 1"),
        ("uniform:1:2.5", "MAX must be a whole number"),
        ("normal:x:3", "MEAN must be a number"),
        ("normal:0.5:3", "MEAN must be >= 1"),
        ("lognormal:10:-1", "STDDEV >= 0"),
        ("normal:inf:1", "MEAN must be finite"),
        ("normal:10:nan", "STDDEV must be finite"),
    ],
)
def test_bad_specs_name_the_flag_the_value_and_the_forms(text: str, why: str) -> None:
    with pytest.raises(LengthSpecError) as caught:
        parse_length(text, "--output-len")
    message = str(caught.value)
    assert message.startswith(f"--output-len {text!r}: ")
    assert why in message
    assert "uniform:MIN:MAX" in message


def _draw(spec: str, seed: int = 11) -> list[int]:
    rng = random.Random(seed)
    dist = parse_length(spec, "--input-len")
    return [dist.sample(rng) for _ in range(SAMPLES)]


def test_samples_follow_the_spec() -> None:
    """Seeded, so these statistics are the same on every run; the tolerances only allow for
    the sampling error of 4000 draws, which a wrong formula would exceed many times over."""
    uniform = _draw("uniform:64:256")
    assert min(uniform) == 64 and max(uniform) == 256
    assert statistics.mean(uniform) == pytest.approx(160, rel=0.02)
    normal = _draw("normal:128:32")
    assert statistics.mean(normal) == pytest.approx(128, rel=0.02)
    assert statistics.stdev(normal) == pytest.approx(32, rel=0.05)
    lognormal = _draw("lognormal:200:150")
    assert statistics.mean(lognormal) == pytest.approx(200, rel=0.05)
    assert statistics.stdev(lognormal) == pytest.approx(150, rel=0.15)
    assert statistics.median(lognormal) < statistics.mean(lognormal)  # the long right tail
    assert _draw("normal:128:32") == normal  # the seed alone decides the samples
    assert _draw("normal:128:32", seed=12) != normal


def test_samples_are_whole_and_at_least_one() -> None:
    wide = _draw("normal:2:20")
    assert min(wide) == 1 and all(isinstance(n, int) for n in wide)
    assert min(_draw("lognormal:1:5")) == 1


def test_a_fixed_length_draws_nothing() -> None:
    rng = random.Random(3)
    before = rng.getstate()
    assert parse_length("9", "--input-len").sample(rng) == 9
    assert rng.getstate() == before
    with pytest.raises(LengthSpecError):
        LengthDist.fixed(0)


def _bodies(config: WorkloadConfig, n: int = 200) -> list[dict[str, object]]:
    work = Workload(config)
    return [orjson.loads(work.next_request().body) for _ in range(n)]


def test_workload_pads_each_prompt_and_sets_max_tokens_per_request() -> None:
    inputs, outputs = parse_length("uniform:3:40", "i"), parse_length("normal:50:10", "o")
    work = Workload(WorkloadConfig("m", seed=5, input_len=inputs, output_len=outputs))
    specs = [work.next_request() for _ in range(300)]
    for spec in specs:
        body = orjson.loads(spec.body)
        assert len(body["messages"][0]["content"].split()) == spec.input_words
        assert body["max_tokens"] == spec.max_tokens
        assert "ignore_eos" not in body
    assert {s.input_words for s in specs} == set(range(3, 41))
    assert statistics.mean(s.max_tokens or 0 for s in specs) == pytest.approx(50, rel=0.05)


def test_length_streams_are_independent_of_each_other_and_of_the_prompts() -> None:
    """Changing the output distribution must not change which prompts are sent or how long."""
    inputs = parse_length("uniform:3:40", "i")
    short = _bodies(WorkloadConfig("m", seed=2, input_len=inputs, max_tokens=4))
    varied = WorkloadConfig("m", seed=2, input_len=inputs, output_len=parse_length("50", "o"))
    long = _bodies(varied)
    assert [b["messages"] for b in short] == [b["messages"] for b in long]
    assert {b["max_tokens"] for b in short} == {4} and {b["max_tokens"] for b in long} == {50}


def test_the_number_shorthands_are_fixed_distributions() -> None:
    config = WorkloadConfig("m", max_tokens=7, input_words=12, ignore_eos=True)
    assert config.outputs == LengthDist.fixed(7) and config.inputs == LengthDist.fixed(12)
    body = _bodies(config, 1)[0]
    assert body["max_tokens"] == 7 and body["ignore_eos"] is True
    with pytest.raises(ValueError, match="not both"):
        WorkloadConfig("m", max_tokens=7, output_len=LengthDist.fixed(7))
    without = Workload(WorkloadConfig("m")).next_request()
    assert "max_tokens" not in orjson.loads(without.body) and without.max_tokens is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--output-len", "uniform:9:3"), "--output-len 'uniform:9:3': MIN must be <= MAX"),
        (("--max-tokens", "lots"), "--max-tokens 'lots': length must be a whole number"),
        (("--input-words", "0"), "--input-words '0': length must be >= 1"),
        (("--input-len", "beta:1:2"), "--input-len 'beta:1:2': unknown distribution"),
        (("--max-tokens", "4", "--output-len", "5"), "not allowed with argument"),
    ],
)
def test_cli_rejects_a_bad_length_with_one_line(
    flags: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--url", "http://127.0.0.1:9", "--requests", "1", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
