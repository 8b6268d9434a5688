"""A request's choices on the engine thread: what the leader tracks for each, how each step's
token is drawn for them under their grammars, and the events that go back to the consumer.

A request of `n` choices is one `Tracked` with `n` `Choice`s, each its own sequence in the
scheduler, its own random draws and its own place in the grammar.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.api import GenerationRequest, TokenEvent
from engine.grammar import GrammarError, Matcher
from engine.sampling import NoTokenAllowed, Row, Sampled, sample_rows
from engine.scheduler import Sequence


@dataclass(slots=True)
class Tracked:
    """A request as the engine thread tracks it, with the way back to its consumer."""

    request: GenerationRequest
    sink: asyncio.Queue[TokenEvent]
    loop: asyncio.AbstractEventLoop
    members: list[Choice] | None = None  # one per choice, once admitted
    open: int = 0  # choices without their final event


@dataclass(slots=True)
class Choice:
    """One choice of a request: its sequence, its own draws and its place in the grammar."""

    item: Tracked
    index: int
    seq: Sequence
    generator: torch.Generator | None
    matcher: Matcher | None


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


def draw(
    logits: torch.Tensor,
    members: list[Choice],
    bitmask: torch.Tensor | None,
    end: Callable[[Choice, str], None],
) -> dict[int, Sampled]:
    """One token per member; a member whose grammar allows nothing (a matcher fault) ends
    with an error and the others are sampled without it."""
    while True:
        rows = [Row(m.seq.params, m.generator, m.seq.prompt_ids, m.seq.output_ids) for m in members]
        try:
            drawn = sample_rows(logits, rows, bitmask)
        except NoTokenAllowed as exc:
            dead = set(exc.rows)
            for i in sorted(dead):
                matcher = members[i].matcher
                why = None if matcher is None else matcher.error
                end(members[i], f"the grammar allows no next token{f': {why}' if why else ''}")
            keep = [i for i in range(len(members)) if i not in dead]
            members, logits = [members[i] for i in keep], logits[keep]
            bitmask = None if bitmask is None else bitmask[keep]
            continue
        break
    out: dict[int, Sampled] = {}
    for member, s in zip(members, drawn, strict=True):
        if member.matcher is not None:
            try:
                member.matcher.accept(s.token)
            except GrammarError as exc:
                end(member, f"grammar: {exc}")
                continue
        out[member.seq.seq_id] = s
    return out


def token_event(member: Choice, drawn: Sampled) -> TokenEvent:
    """The event for a choice's token of the last step (its text is the delta since the last)."""
    seq = member.seq
    return TokenEvent(
        request_id=member.item.request.request_id,
        token_id=drawn.token,
        text=seq.take_text_delta(),
        finished=seq.is_finished,
        finish_reason=None if seq.finish_reason is None else str(seq.finish_reason),
        prompt_tokens=len(seq.prompt_ids),
        completion_tokens=len(seq.output_ids),
        index=member.index,
        logprob=drawn.logprob,
        top_logprobs=drawn.top,
        cached_tokens=seq.num_cached_tokens or 0,
    )


def final_event(
    request: GenerationRequest, completion: int | None, reason: str, error: str | None
) -> TokenEvent:
    return TokenEvent(
        request_id=request.request_id,
        token_id=None,
        text="",
        finished=True,
        finish_reason=reason,
        prompt_tokens=len(request.prompt_ids),
        completion_tokens=completion or 0,
        error=error,
    )
