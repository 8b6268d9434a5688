"""Length distributions for prompts and answers: `128`, `uniform:64:256`, `normal:128:32`, ...

Real traffic is not one length, and batching servers behave very differently when requests
of mixed lengths finish at different times, so a fixed length flatters them. The set is kept
to what `vllm bench serve`, guidellm and genai-perf offer between them: a fixed length, a
uniform range, a normal (mean and stddev) and a log-normal for the heavy right tail chat
lengths have. Normal and log-normal take the same mean and stddev of the *length*, so
switching between them changes the shape and not the scale. Samples are whole numbers
clamped to >= 1, since neither a prompt nor a max_tokens can be empty.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

Kind = Literal["fixed", "uniform", "normal", "lognormal"]
FORMS = "N, uniform:MIN:MAX, normal:MEAN:STDDEV or lognormal:MEAN:STDDEV"


class LengthSpecError(ValueError):
    """A length spec the user gave cannot be used; the message names the flag and value."""


@dataclass(frozen=True, slots=True)
class LengthDist:
    """`spec` is the canonical text form, written to result.json so a run can be repeated."""

    kind: Kind
    a: float
    b: float = 0.0

    @classmethod
    def fixed(cls, n: int) -> LengthDist:
        """The Python-API shorthand for `N` (`max_tokens=`/`input_words=` of WorkloadConfig)."""
        if n < 1:
            raise LengthSpecError(f"a fixed length must be >= 1, got {n}")
        return cls("fixed", n)

    @property
    def spec(self) -> str:
        if self.kind == "fixed":
            return _text(self.a)
        return f"{self.kind}:{_text(self.a)}:{_text(self.b)}"

    def sample(self, rng: random.Random) -> int:
        """A fixed length draws nothing from `rng`, so it leaves other draws unchanged."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        if self.kind == "normal":
            return max(1, round(rng.gauss(self.a, self.b)))
        mu, sigma = _lognormal_params(self.a, self.b)
        return max(1, round(rng.lognormvariate(mu, sigma)))


def _text(value: float) -> str:
    """Exact, so the spec re-parses to the same distribution (`:g` would turn 10**6 into 1e+06)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _lognormal_params(mean: float, stddev: float) -> tuple[float, float]:
    """The underlying normal's (mu, sigma) whose log-normal has this mean and stddev."""
    sigma2 = math.log1p((stddev / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def parse_length(text: str, flag: str) -> LengthDist:
    """One parser for every length flag, so they all accept and refuse the same things."""
    try:
        return _parse(text.strip())
    except _Invalid as why:
        raise LengthSpecError(f"{flag} {text!r}: {why}; expected {FORMS}") from None


class _Invalid(ValueError):
    """Why a spec is wrong, before the flag and value are known to the message."""


def _parse(text: str) -> LengthDist:
    kind, _, rest = text.partition(":")
    if not rest:
        return LengthDist("fixed", _whole(kind, "length"))
    parts = rest.split(":")
    if kind not in ("uniform", "normal", "lognormal"):
        raise _Invalid(f"unknown distribution {kind!r}")
    if len(parts) != 2:
        raise _Invalid(f"{kind} takes two numbers")
    if kind == "uniform":
        low, high = _whole(parts[0], "MIN"), _whole(parts[1], "MAX")
        if low > high:
            raise _Invalid("MIN must be <= MAX")
        return LengthDist("uniform", low, high)
    mean, stddev = _number(parts[0], "MEAN"), _number(parts[1], "STDDEV")
    if mean < 1 or stddev < 0:
        raise _Invalid("MEAN must be >= 1 and STDDEV >= 0")
    return LengthDist("normal" if kind == "normal" else "lognormal", mean, stddev)


def _whole(part: str, name: str) -> int:
    try:
        value = int(part)
    except ValueError:
        raise _Invalid(f"{name} must be a whole number, got {part!r}") from None
    if value < 1:
        raise _Invalid(f"{name} must be >= 1")
    return value


def _number(part: str, name: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise _Invalid(f"{name} must be a number, got {part!r}") from None
    if not math.isfinite(value):
        raise _Invalid(f"{name} must be finite")
    return value
