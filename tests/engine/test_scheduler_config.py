"""Config and sampling-parameter validation: errors name the field and the bad value."""

from __future__ import annotations

import pytest

from engine.scheduler import (
    DEFAULT_PREFILL_CHUNK,
    InvalidConfig,
    InvalidParams,
    SamplingParams,
    SchedulerConfig,
)
from tests.engine.scheduler_support import make


def test_defaults_are_valid() -> None:
    assert SchedulerConfig() == SchedulerConfig(8, DEFAULT_PREFILL_CHUNK, 8, 2048)
    assert SamplingParams() == SamplingParams(16, 1.0, 1.0, None, (), (), False)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("num_slots", -1),
        ("max_seq_len", 1),
        ("max_seq_len", 2.5),
    ],
)
def test_config_rejects_out_of_range(field: str, value: object) -> None:
    with pytest.raises(InvalidConfig, match=f"^{field}=") as err:
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]
    assert (err.value.field, err.value.value) == (field, value)


def test_a_budget_under_the_batch_size_still_decodes_the_full_batch() -> None:
    """The budget is for prompt tokens: decodes ride along outside it."""
    sched = make(max_num_seqs=8, num_slots=8, max_num_batched_tokens=4)
    for i in range(8):
        sched.add(i, [1], SamplingParams())
    assert len(sched.schedule().seqs) == 8


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("stop", "###"),
        ("stop", ("ok", "")),
        ("stop_token_ids", (-1,)),
    ],
)
def test_params_reject_out_of_range(field: str, value: object) -> None:
    with pytest.raises(InvalidParams, match=f"^{field}=") as err:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert err.value.field == field


def test_params_accept_edges() -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0, top_p=1.0, seed=0, stop=("x",))
    assert params.stop == ("x",)
