"""The sampling fields beyond temperature and top_p: n, penalties, logit_bias, logprobs, priority.

Each is checked here with OpenAI's (or vLLM's) range and read into the value the engine takes;
a wrong value is a 400 naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from engine.scheduler.sequence import MAX_LOGPROBS
from engine.server.errors import JSON, bad

MAX_N = 16  # choices per request; each holds a KV slot, and the unit's slots bound it anyway
LOGIT_BIAS_LIMIT = 100.0


def choices(data: JSON) -> int:
    n = _int(data, "n")
    if n is None:
        return 1
    if not 1 <= n <= MAX_N:
        raise bad(f"'n' must be in [1, {MAX_N}], got {n}", "n")
    return n


def penalties(data: JSON) -> JSON:
    """presence/frequency in [-2, 2] (OpenAI), repetition > 0 (vLLM); absent fields omitted."""
    out: JSON = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = _float(data, name)
        if value is not None:
            if not -2 <= value <= 2:
                raise bad(f"'{name}' must be a number in [-2, 2], got {value!r}", name)
            out[name] = value
    value = _float(data, "repetition_penalty")
    if value is not None:
        if not 0 < value <= 10:
            message = f"'repetition_penalty' must be a number in (0, 10], got {value!r}"
            raise bad(message, "repetition_penalty")
        out["repetition_penalty"] = value
    return out


def logit_bias(data: JSON, vocab_size: int) -> tuple[tuple[int, float], ...] | None:
    """OpenAI's map of token id (as a string key) to a bias in [-100, 100]."""
    value = data.get("logit_bias")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("'logit_bias' must be an object mapping token ids to numbers", "logit_bias")
    pairs: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except ValueError:
            raise bad(f"'logit_bias' key {key!r} is not a token id", "logit_bias") from None
        if not 0 <= token < vocab_size:
            raise bad(f"'logit_bias' token id {token} is outside [0, {vocab_size})", "logit_bias")
        ok = isinstance(bias, int | float) and not isinstance(bias, bool) and math.isfinite(bias)
        if not ok or not -LOGIT_BIAS_LIMIT <= bias <= LOGIT_BIAS_LIMIT:
            message = f"'logit_bias' for token {token} must be a number in [-100, 100]"
            raise bad(f"{message}, got {bias!r}", "logit_bias")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))


def chat_logprobs(data: JSON) -> int | None:
    """Chat: `logprobs: true` asks for them, `top_logprobs` (0..20) for the alternatives."""
    wanted = data.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise bad("'logprobs' must be a boolean", "logprobs")
    top = _int(data, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad(f"'top_logprobs' must be in [0, {MAX_LOGPROBS}], got {top}", "top_logprobs")
    if not wanted:
        if top:
            raise bad("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
        return None
    return top or 0


def completion_logprobs(data: JSON) -> int | None:
    """Completions: `logprobs` is the number of alternatives (0..20) per token."""
    value = data.get("logprobs")
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'logprobs' must be an integer in [0, {MAX_LOGPROBS}]", "logprobs")
    if not 0 <= value <= MAX_LOGPROBS:
        raise bad(f"'logprobs' must be in [0, {MAX_LOGPROBS}], got {value}", "logprobs")
    return value


def priority(data: JSON) -> int | None:
    """vLLM's field: lower values are scheduled sooner."""
    value = _int(data, "priority")
    if value is not None and not -(2**31) <= value < 2**31:
        raise bad(f"'priority' must fit in 32 bits, got {value}", "priority")
    return value


def seed(data: JSON) -> int | None:
    value = _int(data, "seed")
    if value is not None and not -(2**63) <= value < 2**64:
        raise bad(f"'seed' must fit in 64 bits, got {value}", "seed")
    return None if value is None else value % 2**64


def typed(data: JSON, name: str, kind: type, what: str, parent: str | None = None) -> Any:
    """The field, None when absent or null; a bool is not accepted where an int is meant."""
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        param = f"{parent}.{name}" if parent else name
        raise bad(f"'{param}' must be {what}, got {type(value).__name__}", param)
    return value


def _int(data: JSON, name: str) -> int | None:
    value: int | None = typed(data, name, int, "an integer")
    return value


def _float(data: JSON, name: str) -> float | None:
    value: Any = data.get(name)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok:
        raise bad(f"'{name}' must be a finite number, got {value!r}", name)
    return float(value)
