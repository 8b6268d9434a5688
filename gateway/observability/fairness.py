"""How evenly each priority class served its tenants lately: Jain's fairness index over the
tokens each tenant was served in the last `window_s` seconds.

    J(x_1..x_n) = (sum x_i)^2 / (n * sum x_i^2)

is 1.0 when every tenant got the same number of tokens and 1/n when one tenant got them all.
The tenants counted (`n`) are those that asked in the class within the window: admitted
(waiting or not) or refused, so a tenant refused throughout counts with 0 tokens and lowers
the index. With one tenant, or when none was served a token, the index is 1.0 (nobody got
more than another).

Blind spots (docs/priority.md): it compares what tenants were served, not what they asked
for, so a tenant that sends little pulls it down even when the line treated it perfectly;
read it under contention (requests waiting or refused), where the line's fair share is what
decides. A request still waiting when the window ends counts only once admitted or refused.

Pure bookkeeping, the clock passed in: `TokenWindow` keeps `buckets` buckets of tokens per
(class, tenant), so memory is the tenants active per bucket, whatever the request rate.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

Shares = dict[str, dict[str, float]]  # class -> tenant -> tokens served in the window


def jain(values: Iterable[float]) -> float | None:
    """Jain's index of `values` (None for none; 1.0 when all are 0)."""
    xs = list(values)
    if not xs:
        return None
    squares = sum(x * x for x in xs)
    if squares == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * squares)


def index(shares: Shares) -> dict[str, float]:
    """Each class's index over its tenants' shares (classes with no tenant left out)."""
    out: dict[str, float] = {}
    for klass, tenants in shares.items():
        value = jain(tenants.values())
        if value is not None:
            out[klass] = value
    return out


def merged(parts: Iterable[Shares]) -> Shares:
    """Several processes' shares as one (the same tenant's tokens summed)."""
    out: Shares = {}
    for part in parts:
        for klass, tenants in part.items():
            into = out.setdefault(klass, {})
            for tenant, tokens in tenants.items():
                into[tenant] = into.get(tenant, 0.0) + tokens
    return out


class TokenWindow:
    def __init__(self, window_s: float = 60.0, buckets: int = 12) -> None:
        self.window_s = window_s
        self._step = window_s / buckets
        self._buckets = buckets
        # (bucket number, (class, tenant) -> tokens), oldest first
        self._ring: deque[tuple[int, dict[tuple[str, str], float]]] = deque()

    def add(self, now: float, klass: str, tenant: str, tokens: float = 0.0) -> None:
        """`tenant` asked in `klass` at `now` and was served `tokens` (0: it is counted)."""
        number = int(now // self._step)
        ring = self._ring
        if not ring or ring[-1][0] != number:
            ring.append((number, {}))
            while ring[0][0] <= number - self._buckets:
                ring.popleft()
        bucket = ring[-1][1]
        key = (klass, tenant)
        bucket[key] = bucket.get(key, 0.0) + tokens

    def shares(self, now: float) -> Shares:
        """Tokens per tenant per class over the last `window_s` (safe from another thread:
        it reads copies)."""
        oldest = int(now // self._step) - self._buckets
        out: Shares = {}
        for number, bucket in list(self._ring):
            if number <= oldest:
                continue
            for (klass, tenant), tokens in list(bucket.items()):
                tenants = out.setdefault(klass, {})
                tenants[tenant] = tenants.get(tenant, 0.0) + tokens
        return out


def from_wire(wire: Mapping[str, Mapping[str, float]]) -> Shares:
    """A worker's shares as its report carried them (JSON)."""
    return {str(k): {str(t): float(v) for t, v in ts.items()} for k, ts in wire.items()}
