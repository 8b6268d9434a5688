"""Usage read from each API's own events, as stock vLLM 0.32 wrote them (tests/data/vllm)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.relay.usage import Usage, UsageReader, of_body, says_usage

VLLM = Path(__file__).resolve().parents[2] / "data" / "vllm"


@pytest.mark.parametrize(
    ("name", "usage"),
    [
        ("responses_stream.sse", Usage(32, 12, 0)),  # response.completed's response.usage
        ("messages_stream.sse", Usage(32, 12)),  # message_start, then message_delta
        ("chat_stream_token_ids.sse", Usage(34, 12)),  # the usage chunk
        ("chat_stream_n2.sse", Usage(34, 24)),  # two choices, one usage for both
        ("chat_stream_prompt_plus_max_tokens_over_context.sse", None),  # none asked for
    ],
)
@pytest.mark.parametrize("seed", range(15))
def test_a_streams_usage_however_its_reads_are_cut(
    name: str, usage: Usage | None, seed: int
) -> None:
    raw = (VLLM / name).read_bytes()
    reader, rng, at = UsageReader(), random.Random(seed), 0
    while at < len(raw):
        step = rng.choice((1, 7, 50, 400, len(raw)))
        reader.feed(raw[at : at + step])
        at += step
    assert reader.usage == usage


@pytest.mark.parametrize(
    ("name", "usage"),
    [
        ("responses.json", Usage(32, 12, 0)),
        ("messages.json", Usage(32, 12)),
        ("chat_token_ids.json", Usage(34, 12)),
        ("models.json", None),
    ],
)
def test_a_whole_answers_usage(name: str, usage: Usage | None) -> None:
    assert of_body((VLLM / name).read_bytes()) == usage


def test_text_that_mentions_usage_is_not_usage() -> None:
    reader = UsageReader()
    reader.feed(b'data: {"choices":[{"text":"the \\"usage\\" field"}]}\n\n')
    assert reader.usage is None
    assert of_body(b'{"choices":[{"text":"\\"usage\\""}]}') is None


@pytest.mark.parametrize(
    ("event", "named"),
    [
        (b'data: {"choices":[]}\n\n', False),
        (b'data: {"choices":[],"usage":null}\n\n', False),
        (b'data: {"choices":[],"usage" :\r\n null}\n\n', False),
        (b'data: {"usage":{"prompt_tokens":1}}\n\n', True),
        (b'data: {"usage":null,"response":{"usage":{"input_tokens":1}}}\n\n', True),
        (b'data: {"delta":{"content":"usage"}}\n\n', True),  # parsed, finds none: harmless
        (b'data: {"usage":nul', True),  # cut short: parsed, and found wanting
    ],
)
def test_an_event_names_a_usage_unless_every_mention_is_null(event: bytes, named: bool) -> None:
    assert says_usage(event) is named


def test_the_cached_tokens_a_unit_reports() -> None:
    """vLLM with --enable-prompt-tokens-details says how many of the prompt's tokens its
    prefix cache held; without it, nothing (None, not 0: it did not say)."""
    body = (
        b'{"usage":{"prompt_tokens":300,"completion_tokens":3,"total_tokens":303,'
        b'"prompt_tokens_details":{"cached_tokens":256}}}'
    )
    assert of_body(body) == Usage(300, 3, 256)
    assert of_body(b'{"usage":{"prompt_tokens":3,"completion_tokens":1}}') == Usage(3, 1, None)
    bad = b'{"usage":{"prompt_tokens":3,"prompt_tokens_details":{"cached_tokens":"x"}}}'
    assert of_body(bad) == Usage(3, 0, None)
    reader = UsageReader()
    reader.feed(b"data: " + body + b"\n\n")
    assert reader.usage == Usage(300, 3, 256)
