"""The tracker on a stock vLLM 0.32's own streams (recorded in tests/data/vllm): it finds the
prompt and generated ids where vLLM puts them, and what it hides leaves vLLM's plain stream."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.proxy.names import Renamer
from gateway.relay.tracker import StreamTracker

pytestmark = pytest.mark.both_relays

VLLM = Path(__file__).resolve().parents[2] / "data" / "vllm"
# Per request, per chunk: never the same twice, so not compared.
VOLATILE = ("id", "created", "system_fingerprint")
IDS = ("prompt_token_ids", "prompt_text", "token_ids")


def events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for event in raw.split(b"\n\n"):
        if event.startswith(b"data: "):
            payload = event[6:]
            out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out


def without(event: Any, keys: tuple[str, ...]) -> Any:
    if isinstance(event, dict):
        return {k: without(v, keys) for k, v in event.items() if k not in keys}
    if isinstance(event, list):
        return [without(v, keys) for v in event]
    return event


def fed(tracker: StreamTracker, raw: bytes, seed: int) -> bytes:
    """`raw` fed in pieces cut at random byte offsets."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(raw)), rng.randint(0, 40)))
    pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    return b"".join(tracker.feed(piece) for piece in pieces)


def recorded_ids(raw: bytes) -> tuple[list[int], list[int]]:
    prompt: list[int] = []
    generated: list[int] = []
    for event in events(raw):
        if not isinstance(event, dict):
            continue
        prompt += event.get("prompt_token_ids") or []
        for choice in event["choices"]:
            prompt += choice.get("prompt_token_ids") or []
            generated += choice.get("token_ids") or []
    return prompt, generated


@pytest.mark.parametrize("unit", ["chat_stream_token_ids", "multinode_tp3_chat_stream_token_ids"])
@pytest.mark.parametrize("seed", range(20))
def test_a_vllm_chat_stream_with_ids_hidden_is_vllms_plain_stream(unit: str, seed: int) -> None:
    """One stock server, and a stock three-node unit (TP = 3) answering the same request."""
    raw = (VLLM / f"{unit}.sse").read_bytes()
    tracker = StreamTracker(chat=True, client_ids=False, include_usage=True)
    out = events(fed(tracker, raw, seed))
    plain = events((VLLM / "chat_stream.sse").read_bytes())
    # Field for field what vLLM sends a client that did not ask for ids (where it lists them
    # as null, the gateway leaves them out), the text identical (the same greedy request).
    assert without(out, VOLATILE + IDS) == without(plain, VOLATILE + IDS)
    assert not any(k in orjson.dumps(out).decode() for k in ('"token_ids"', '"prompt_token_ids"'))
    prompt, generated = recorded_ids(raw)
    assert tracker.prompt_ids is not None and tracker.prompt_ids.tolist() == prompt
    assert len(prompt) == 34
    assert tracker.generated == generated and tracker.committed == len(generated) == 12
    assert (tracker.finish_reason, tracker.done, tracker.error) == ("length", True, None)
    assert tracker.resume_point() == prompt + generated


@pytest.mark.parametrize(
    "name", ["completions_stream_token_ids", "completions_stream_token_ids_prompt_ids"]
)
@pytest.mark.parametrize("seed", range(10))
def test_a_vllm_completions_stream_is_read_where_vllm_puts_the_ids(name: str, seed: int) -> None:
    raw = (VLLM / f"{name}.sse").read_bytes()
    tracker = StreamTracker(chat=False, client_ids=False, include_usage=True)
    out = events(fed(tracker, raw, seed))
    prompt, generated = recorded_ids(raw)
    assert tracker.prompt_ids is not None and tracker.prompt_ids.tolist() == prompt and prompt
    assert tracker.generated == generated and tracker.committed == len(generated)
    assert without(out, VOLATILE) == without(events(raw), VOLATILE + IDS)
    assert out[-1] == "[DONE]" and tracker.finish_reason == "length"


@pytest.mark.parametrize("seed", range(5))
def test_a_client_that_asked_for_ids_gets_vllms_bytes_unchanged(seed: int) -> None:
    raw = (VLLM / "chat_stream_token_ids.sse").read_bytes()
    tracker = StreamTracker(chat=True, client_ids=True, include_usage=True)
    assert fed(tracker, raw, seed) == raw


@pytest.mark.parametrize("seed", range(10))
def test_renamed_before_tracked_every_model_field_is_public(seed: int) -> None:
    raw = (VLLM / "chat_stream_token_ids.sse").read_bytes()
    names, tracker = Renamer("smol", "SmolLM2-135M-Instruct"), StreamTracker(True, False, True)
    rng = random.Random(seed)
    out, at = b"", 0
    while at < len(raw):
        step = rng.randint(1, 90)
        out += tracker.feed(names.feed(raw[at : at + step]))
        at += step
    out += tracker.feed(names.flush())
    models = {e["model"] for e in events(out) if isinstance(e, dict)}
    assert models == {"SmolLM2-135M-Instruct"}
    assert tracker.template["model"] == "SmolLM2-135M-Instruct"
