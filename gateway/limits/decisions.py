"""What a key may do (`KeyLimits`) and what `Limiter.admit` answers: a `Grant` or a `Refusal`."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.limits.headers import rate_headers, retry_after
from gateway.limits.store import Dim


@dataclass(frozen=True, slots=True)
class KeyLimits:
    rpm: int | None = None  # requests admitted in any 60 s span
    tpm: int | None = None  # tokens (prompt + completion) in any 60 s span
    max_inflight: int | None = None  # requests admitted and not yet settled

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "max_inflight"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} = {value!r}: must be a whole number >= 1, or unset")

    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_inflight is not None

    def share(self, ways: int) -> KeyLimits:
        """Each limit split `ways` ways (at least 1 each): one process's part of a key's."""
        if ways <= 1:
            return self

        def part(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // ways)

        return KeyLimits(part(self.rpm), part(self.tpm), part(self.max_inflight))


@dataclass(frozen=True, slots=True)
class Standing:
    """One window's figures for the headers: the limit, what is left, when it is empty again
    (an absolute time)."""

    limit: int
    remaining: int
    reset_at: float

    def header_values(self, now: float) -> tuple[int, int, float]:
        return self.limit, self.remaining, self.reset_at - now


@dataclass(slots=True, eq=False)
class Grant:
    key_id: str
    limits: KeyLimits
    bucket: int  # where the tokens were reserved (the settle's delta goes there)
    tokens: int  # reserved at admission (0 without a tpm)
    now: float
    requests_standing: Standing | None = None
    tokens_standing: Standing | None = None
    settled: bool = False

    def headers(self) -> dict[str, str]:
        """The x-ratelimit-* headers for the answer (only those of limits the key has)."""
        requests, tokens = self.requests_standing, self.tokens_standing
        return rate_headers(
            requests.header_values(self.now) if requests else None,
            tokens.header_values(self.now) if tokens else None,
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    dim: Dim  # the limit that refused
    message: str
    retry_after: int  # whole seconds, >= 1
    rate_headers: dict[str, str] = field(default_factory=dict)  # the six x-ratelimit-*
    too_large: bool = False  # the request alone exceeds the limit: waiting will not help

    code = "rate_limit_exceeded"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after), **self.rate_headers}


def refusal(
    dim: Dim, key_id: str, limit: int, used: int, need: int, wait: float, headers: dict[str, str]
) -> Refusal:
    names = {"requests": "requests per minute", "tokens": "tokens per minute"}
    too_large = need > limit
    if dim == "inflight":
        text = f"Too many requests in flight for key {key_id}: limit {limit}."
    elif too_large:
        text = f"Request too large for {names[dim]} on key {key_id}: limit {limit}, "
        text += f"requested {need}."
    else:
        text = f"Rate limit reached for {names[dim]} on key {key_id}: limit {limit}, "
        text += f"used {used}, requested {need}."
    seconds = retry_after(wait)
    if not too_large:
        text += f" Please try again in {seconds}s."
    return Refusal(dim, text, seconds, headers, too_large)
