"""What each request asks for: prompts, output length and session affinity.

Built once from the CLI options and seeded, so two runs with the same seed send the same
sequence of bodies and session ids and their results can be compared.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import orjson

SHOPPING_PROMPTS: tuple[str, ...] = (
    "Which running shoes under $120 are good for flat feet?",
    "Compare the two cheapest 65-inch OLED TVs you have in stock.",
    "I need a gift for a 10-year-old who likes science. Any ideas under $40?",
    "Is this blender dishwasher safe, and what is its warranty?",
    "Can I return a jacket I bought online at a physical store?",
    "What is the difference between the standard and pro versions of this vacuum?",
    "Suggest a waterproof hiking backpack for a three-day trip.",
    "Do you ship to Canada, and how long does delivery take?",
    "Which laptop is better for video editing: 16 GB RAM or a faster CPU?",
    "Find me a queen-size mattress that is good for side sleepers.",
    "What coffee grinder would you recommend for espresso at home?",
    "Are these headphones compatible with my phone's Bluetooth version?",
    "Show me eco-friendly cleaning products that are safe for pets.",
    "My order has not arrived after ten days. What can I do?",
    "Which stroller folds with one hand and fits in a small car trunk?",
    "What size should I order if I usually wear a medium in this brand?",
)

FILLER = ("please", "consider", "price", "quality", "reviews", "delivery", "and", "stock")


class WorkloadError(ValueError):
    """A prompt file the user gave cannot be used; reported as a message, not a traceback."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    body: bytes
    session_id: str | None


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    model: str
    max_tokens: int | None = None
    input_words: int | None = None
    session_share: float = 0.0
    sessions: int = 16
    seed: int = 0


def load_jsonl(path: Path) -> list[str]:
    """Each line is {"prompt": str} or {"messages": [{"role", "content"}, ...]}."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read {path}: {exc}") from None
    prompts = [_prompt_of(path, n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise WorkloadError(f"{path} holds no prompts")
    return prompts


def _prompt_of(path: Path, lineno: int, line: str) -> str:
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise WorkloadError(f"{path}:{lineno}: not JSON") from None
    if isinstance(item, dict) and isinstance(item.get("prompt"), str):
        return str(item["prompt"])
    if isinstance(item, dict) and isinstance(item.get("messages"), list):
        texts = [m.get("content") for m in item["messages"] if isinstance(m, dict)]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(str(t) for t in texts)
    raise WorkloadError(f'{path}:{lineno}: expected {{"prompt": str}} or {{"messages": [...]}}')


def pad_words(text: str, words: int) -> str:
    """Stretch (or cut) a prompt to about `words` words so the input length is controlled."""
    have = text.split()
    if len(have) >= words:
        return " ".join(have[:words])
    extra = [FILLER[i % len(FILLER)] for i in range(words - len(have))]
    return " ".join(have + extra)


class Workload:
    """Hands out request bodies in a seeded order; sessions are drawn from a fixed pool."""

    def __init__(self, config: WorkloadConfig, prompts: list[str] | None = None) -> None:
        self.config = config
        self._prompts = list(prompts) if prompts else list(SHOPPING_PROMPTS)
        if config.input_words is not None:
            self._prompts = [pad_words(p, config.input_words) for p in self._prompts]
        self._rng = random.Random(config.seed)

    def next_request(self) -> RequestSpec:
        prompt = self._rng.choice(self._prompts)
        session = None
        if self._rng.random() < self.config.session_share:
            session = f"loadtest-session-{self._rng.randrange(max(1, self.config.sessions))}"
        return RequestSpec(orjson.dumps(self._body(prompt)), session)

    def _body(self, prompt: str) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.config.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt}],
        }
        if self.config.max_tokens is not None:
            body["max_tokens"] = self.config.max_tokens
        return body
