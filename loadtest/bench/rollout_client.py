"""What the rollout benchmarks (and tests) do as a client: keep conversations going, start a
rollout through the admin API, and wait for it to reach a step or to end."""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

CHAT = "/v1/chat/completions"


@dataclass
class Tally:
    """The conversations' requests: served by unit, failed with their status and ending."""

    served: Counter[str] = field(default_factory=Counter)
    failed: list[str] = field(default_factory=list)
    by_session: dict[str, set[str]] = field(default_factory=dict)  # the units each one met


async def converse(
    http: aiohttp.ClientSession,
    public: str,
    model: str,
    tally: Tally,
    stop: asyncio.Event,
    turns: Sequence[str] = ("hi", "hi", "hi"),
    max_tokens: int = 6,
    grow: bool = False,
) -> None:
    """Conversations of `turns` (one session id each, as `x-session-id`) until `stop`. `grow`:
    each turn carries the ones before it with a short answer, as a chat client sends them."""
    sessions = itertools.count()
    while not stop.is_set():
        session = f"c{next(sessions)}-{secrets.token_hex(3)}"
        messages: list[dict[str, str]] = []
        for question in turns:
            asked = {"role": "user", "content": question}
            messages = [*messages, asked] if grow else [asked]
            body = {"model": model, "messages": messages, "max_tokens": max_tokens,
                    "stream": True}  # fmt: skip
            async with http.post(public + CHAT, json=body, headers={"x-session-id": session}) as r:
                text = await r.text()
                unit = r.headers.get("x-unitgate-unit", "?")
                if r.status != 200 or "[DONE]" not in text or '"error"' in text:
                    tally.failed.append(f"{r.status} {unit}: {text[-200:]}")
                tally.served[unit] += 1
                tally.by_session.setdefault(session, set()).add(unit)
            if grow:
                messages.append({"role": "assistant", "content": "ok"})


async def start(admin: aiohttp.ClientSession, operator: str, ask: dict[str, Any]) -> Any:
    """POST /admin/rollouts (`admin` carries the token); SystemExit if refused."""
    async with admin.post(operator + "/admin/rollouts", json=ask) as resp:
        answer = await resp.json()
        if resp.status != 201:
            raise SystemExit(f"rollout refused: {resp.status} {answer}")
        return answer


async def current(admin: aiohttp.ClientSession, operator: str) -> dict[str, Any]:
    async with admin.get(operator + "/admin/rollouts/current") as resp:
        found: dict[str, Any] = await resp.json()
        return found


async def ended(
    admin: aiohttp.ClientSession,
    operator: str,
    every: float = 0.25,
    within: float = 3600.0,
    pause_is_an_error: bool = False,
) -> tuple[dict[str, Any], float]:
    """The rollout once it has ended, and the seconds waited. `pause_is_an_error`: a pause
    (gates short of samples) is a load problem here, not a verdict: SystemExit."""
    started = time.monotonic()
    while True:
        found = await current(admin, operator)
        if found["state"] == "paused" and pause_is_an_error:
            raise SystemExit(f"rollout paused: {found['reason']} (raise --concurrency)")
        if found["state"] not in ("running", "paused"):
            return found, time.monotonic() - started
        if time.monotonic() - started > within:
            raise SystemExit(f"the rollout did not end within {within:g} s: {found}")
        await asyncio.sleep(every)


async def at_step(
    admin: aiohttp.ClientSession, operator: str, step: int = 0, within: float = 10.0
) -> dict[str, Any]:
    """The rollout once its current cell is at `step`; SystemExit if not within `within`."""
    deadline = time.monotonic() + within
    while True:
        found = await current(admin, operator)
        if found.get("step") == step:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"the rollout did not reach step {step}: {found}")
        await asyncio.sleep(0.05)
