"""What each request asks for: prompts, input and output lengths and session affinity.

Built once from the CLI options and seeded, so two runs with the same seed send the same
sequence of bodies and session ids and their results can be compared. Prompts, input lengths
and output lengths draw from separate generators, so changing one distribution leaves the
other two sequences as they were and a comparison isolates the change.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from loadtest.gen.lengths import LengthDist
from loadtest.gen.tokens import TokenCounter, approx_words

Endpoint = Literal["chat", "completions"]
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
PATHS: dict[str, str] = {"chat": CHAT_PATH, "completions": COMPLETIONS_PATH}

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
    """`input_words`, `input_tokens` (None without a tokenizer) and `max_tokens` are what was
    sent, kept for the length summary; `path` is the endpoint's, appended to the base URL."""

    body: bytes
    session_id: str | None
    input_words: int = 0
    max_tokens: int | None = None
    path: str = CHAT_PATH
    stream: bool = True
    input_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """`max_tokens`/`input_words` are shorthands for a fixed `output_len`/`input_len`.

    `input_len` is in words; `prompt_tokens` is in the tokens of the `Workload`'s tokenizer
    (exact), or approximated from words without one (loadtest.gen.tokens). The server's usage
    reports the real prompt tokens, which the summary shows next to what was sent.
    `ignore_eos` asks engines that know it (vLLM, ours) to produce exactly max_tokens, so the
    output distribution is the realised one. `endpoint` is chat or (text) completions, each
    streamed or not.
    """

    model: str
    max_tokens: int | None = None
    input_words: int | None = None
    session_share: float = 0.0
    sessions: int = 16
    seed: int = 0
    input_len: LengthDist | None = None
    output_len: LengthDist | None = None
    ignore_eos: bool = False
    prompt_tokens: LengthDist | None = None
    endpoint: Endpoint = "chat"
    stream: bool = True

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.output_len is not None:
            raise ValueError("give max_tokens or output_len, not both")
        given = (self.input_words, self.input_len, self.prompt_tokens)
        if sum(x is not None for x in given) > 1:
            raise ValueError("give one of input_words, input_len and prompt_tokens")
        if self.endpoint not in PATHS:
            raise ValueError(f"endpoint: expected chat or completions, got {self.endpoint!r}")

    @property
    def inputs(self) -> LengthDist | None:
        if self.input_words is not None:
            return LengthDist.fixed(self.input_words)
        return self.input_len

    @property
    def outputs(self) -> LengthDist | None:
        if self.max_tokens is not None:
            return LengthDist.fixed(self.max_tokens)
        return self.output_len


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
    """Hands out request bodies in a seeded order; sessions are drawn from a fixed pool.

    `tokenizer` makes `prompt_tokens` exact, and counts answers whose server gave no usage.
    """

    def __init__(
        self,
        config: WorkloadConfig,
        prompts: list[str] | None = None,
        tokenizer: TokenCounter | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self._prompts = list(prompts) if prompts else list(SHOPPING_PROMPTS)
        self._inputs = config.inputs if config.prompt_tokens is None else config.prompt_tokens
        self._outputs = config.outputs
        self._rng = random.Random(config.seed)
        # String seeds hash with SHA-512, so these streams are the same in every process.
        self._input_rng = random.Random(f"{config.seed}/input-len")
        self._output_rng = random.Random(f"{config.seed}/output-len")

    def next_request(self) -> RequestSpec:
        prompt = self._rng.choice(self._prompts)
        session = None
        if self._rng.random() < self.config.session_share:
            session = f"loadtest-session-{self._rng.randrange(max(1, self.config.sessions))}"
        prompt, tokens = self._sized(prompt)
        max_tokens = None if self._outputs is None else self._outputs.sample(self._output_rng)
        body = orjson.dumps(self._body(prompt, max_tokens))
        cfg = self.config
        path = PATHS[cfg.endpoint]
        return RequestSpec(body, session, len(prompt.split()), max_tokens, path, cfg.stream, tokens)

    def _sized(self, prompt: str) -> tuple[str, int | None]:
        """The prompt at its drawn length, and its token count when a tokenizer measured it."""
        if self._inputs is None:
            return prompt, None
        n = self._inputs.sample(self._input_rng)
        if self.config.prompt_tokens is None:
            return pad_words(prompt, n), None
        if self.tokenizer is None:
            return pad_words(prompt, approx_words(n)), None
        return self.tokenizer.fit(prompt, n, " ".join(FILLER))

    def _body(self, prompt: str, max_tokens: int | None) -> dict[str, object]:
        body: dict[str, object] = {"model": self.config.model, "stream": self.config.stream}
        if self.config.stream:
            body["stream_options"] = {"include_usage": True}
        if self.config.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if self.config.ignore_eos:
            body["ignore_eos"] = True
        return body
