"""One key's bookkeeping in this process: its leases, its in-flight slots and its own window.

Pure and synchronous (the `Limiter` does the awaiting): `reserve` spends what the leases
cover, `apply` or `undo` finishes an admission once the store answered, `fallback` admits
against this replica's share while the store is away, and `flush` collects what goes back.

The own window (`own`) counts what this process admitted (and the token settles), bucket by
bucket: it is what the share is checked against while the store is away, so a replica that
already spent its share of the minute before the outage does not start again from zero.
"""

from __future__ import annotations

from gateway.limits import window
from gateway.limits.decisions import Grant, KeyLimits, Refusal, Standing, refusal
from gateway.limits.lease import Lease, Slots
from gateway.limits.store import Answer, Changes, Dim

Need = tuple[Dim, int, int]  # (dim, limit, units)


def needs(limits: KeyLimits, tokens: int) -> list[Need]:
    found: list[Need] = []
    if limits.rpm is not None:
        found.append(("requests", limits.rpm, 1))
    if limits.tpm is not None and tokens > 0:
        found.append(("tokens", limits.tpm, tokens))
    if limits.max_inflight is not None:
        found.append(("inflight", limits.max_inflight, 1))
    return found


class Account:
    __slots__ = ("blocked", "held_sent", "key_id", "leases", "own", "slots", "taking")

    def __init__(self, key_id: str) -> None:
        self.key_id = key_id
        self.leases: dict[Dim, Lease] = {}
        self.own: dict[Dim, dict[int, int]] = {"requests": {}, "tokens": {}}
        self.slots = Slots()
        self.taking = 0  # takes in progress (the held count is not pushed meanwhile)
        self.held_sent = 0
        # The store's last refusals, by limit: (until, units asked, its answer). Until then a
        # request asking as much is refused here, so a client over its limit costs the store
        # one call per bucket, not one per request.
        self.blocked: dict[Dim, tuple[float, int, Answer]] = {}

    def reserve(self, wanted: list[Need], bucket: int) -> tuple[list[Need], list[Need]]:
        """Spend what the leases and held slots cover: (reserved, still to ask the store). A
        lease too small for a need is spent whole and only the rest is asked for."""
        reserved: list[Need] = []
        missing: list[Need] = []
        for need in wanted:
            dim, limit, units = need
            if dim == "inflight":
                (reserved if self.slots.acquire() else missing).append(need)
                continue
            lease = self.leases.get(dim)
            spent = min(units, lease.unspent) if lease and lease.bucket == bucket else 0
            if spent and lease is not None:
                lease.unspent -= spent
                reserved.append((dim, limit, spent))
            if spent < units:
                missing.append((dim, limit, units - spent))
        return reserved, missing

    def return_stale(self, missing: list[Need], bucket: int) -> Changes | None:
        """The unspent rest of each lease of an earlier bucket that a take asks for again:
        handed back before the take (None: nothing to hand back). Left to the next flush,
        the store would count it against the take, and a burst crossing a second would be
        refused under its limit."""
        changes: Changes | None = None
        for dim, _, _ in missing:
            lease = self.leases.get(dim)
            if lease is not None and lease.bucket != bucket and lease.unspent > 0:
                changes = changes or Changes()
                changes.add(self.key_id, dim, lease.bucket, -lease.unspent)
                lease.unspent = 0
        return changes

    def undo(self, reserved: list[Need], bucket: int, pending: Changes) -> None:
        for dim, _, units in reserved:
            if dim == "inflight":
                self.slots.release()
                continue
            lease = self.leases.get(dim)
            if lease is not None and lease.bucket == bucket:
                lease.unspent += units
            else:
                pending.add(self.key_id, dim, bucket, -units)

    def apply(
        self, asked: list[Need], answers: list[Answer], bucket: int, pending: Changes
    ) -> None:
        """A take was granted: spend each need, keep the extra as a lease (or held slots)."""
        for (dim, _, units), answer in zip(asked, answers, strict=True):
            self.blocked.pop(dim, None)
            if dim == "inflight":
                self.slots.held += answer.granted
                self.slots.used += units
                continue
            lease = self.leases.get(dim)
            if lease is not None and lease.bucket != bucket:
                pending.add(self.key_id, dim, lease.bucket, -lease.unspent)
                lease = None
            shared = answer.used + answer.granted
            if lease is None:
                self.leases[dim] = Lease(bucket, 0, shared, answer.empty_at)
                lease = self.leases[dim]
            lease.unspent += answer.granted - units
            lease.shared_used = shared
            lease.empty_at = max(lease.empty_at, answer.empty_at, window.leaves_at(bucket))

    def remember(self, asked: list[Need], answers: list[Answer], now: float, hold: float) -> None:
        """Keep a refusal: a window's until the end of the bucket (or until it frees, if
        sooner), in-flight slots' for `hold` seconds (a release may come any time)."""
        for (dim, _, units), answer in zip(asked, answers, strict=True):
            if answer.frees_at != now:
                end = window.bucket_of(now) + 1.0
                until = now + hold if dim == "inflight" else min(answer.frees_at, end)
                self.blocked[dim] = (until, units, answer)

    def still_blocked(self, missing: list[Need], now: float) -> tuple[list[Need], list[Answer]]:
        """The needs a remembered refusal still refuses, with that refusal's answers."""
        needs_, answers = [], []
        for need in missing:
            entry = self.blocked.get(need[0])
            if entry is not None and entry[0] > now and need[2] >= entry[1]:
                needs_.append(need)
                answers.append(entry[2])
        return needs_, answers

    def record(self, wanted: list[Need], bucket: int) -> None:
        for dim, _, units in wanted:
            if dim != "inflight":
                own = self.own[dim]
                if bucket in own:  # the common case: this bucket has admissions already
                    own[bucket] += units
                else:
                    window.add(own, bucket, units, bucket)

    def grant(self, limits: KeyLimits, tokens: int, now: float) -> Grant:
        bucket = window.bucket_of(now)
        grant = Grant(self.key_id, limits, bucket, tokens, now)
        if limits.rpm is not None:
            grant.requests_standing = self.standing("requests", limits.rpm, now, bucket)
        if limits.tpm is not None:
            grant.tokens_standing = self.standing("tokens", limits.tpm, now, bucket)
        return grant

    def standing(self, dim: Dim, limit: int, now: float, bucket: int) -> Standing:
        """The fleet's figures as this process knows them: at its last take, less what its
        lease has spent since (without a lease of this bucket: its own window)."""
        lease = self.leases.get(dim)
        if lease is None or lease.bucket != bucket:
            return Standing(limit, limit - window.used(self.own[dim], bucket), now)
        return Standing(limit, limit - lease.shared_used + lease.unspent, lease.empty_at)

    def refused(
        self, limits: KeyLimits, asked: list[Need], answers: list[Answer], now: float, tokens: int
    ) -> Refusal:
        standings = {
            dim: Standing(limit, limit - a.used, a.empty_at)
            for (dim, limit, _), a in zip(asked, answers, strict=True)
        }
        (dim, limit, units), answer = max(
            ((n, a) for n, a in zip(asked, answers, strict=True) if a.frees_at != now),
            key=lambda pair: pair[1].frees_at,
        )
        units = tokens if dim == "tokens" else units  # the whole need, not what a lease lacked
        return self._refusal(
            limits, dim, limit, answer.used, units, answer.frees_at, now, standings
        )

    def over_share(
        self, limits: KeyLimits, tokens: int, now: float, replicas: int
    ) -> tuple[list[Need], dict[Dim, Standing], Refusal | None]:
        """This replica's share of each limit (limit // replicas, at least 1) against what it
        admitted itself: the needs, the standings, and the refusal if one share is spent."""
        bucket = window.bucket_of(now)
        wanted = [
            (dim, max(1, limit // replicas), units) for dim, limit, units in needs(limits, tokens)
        ]
        standings: dict[Dim, Standing] = {
            dim: Standing(
                share,
                share - window.used(self.own[dim], bucket),
                window.empty_at(self.own[dim], now),
            )
            for dim, share, _ in wanted
            if dim != "inflight"
        }
        for dim, share, units in wanted:
            if dim == "inflight":
                if self.slots.used + units > share:
                    refused = self._refusal(
                        limits, dim, share, self.slots.used, units, now + 1, now, standings
                    )
                    return wanted, standings, refused
                continue
            used = window.used(self.own[dim], bucket)
            if used + units > share:
                frees = window.frees_at(self.own[dim], share, units, now)
                refused = self._refusal(limits, dim, share, used, units, frees, now, standings)
                return wanted, standings, refused
        return wanted, standings, None

    def fallback(
        self, limits: KeyLimits, tokens: int, now: float, replicas: int, pending: Changes
    ) -> Grant | Refusal:
        """Admit against this replica's share of each limit (limit // live replicas, at least
        1), counting what it admitted itself; what it admits is replayed to the store later."""
        bucket = window.bucket_of(now)
        wanted, standings, refused = self.over_share(limits, tokens, now, replicas)
        if refused is not None:
            return refused
        for dim, _, units in wanted:
            if dim == "inflight":
                self.slots.used += units
                self.slots.held = max(self.slots.held, self.slots.used)
            else:
                pending.add(self.key_id, dim, bucket, units)
        self.record(wanted, bucket)
        grant = Grant(self.key_id, limits, bucket, tokens, now)
        grant.requests_standing = standings.get("requests")
        grant.tokens_standing = standings.get("tokens")
        return grant

    def _refusal(
        self,
        limits: KeyLimits,
        dim: Dim,
        limit: int,
        used: int,
        units: int,
        frees_at: float,
        now: float,
        standings: dict[Dim, Standing],
    ) -> Refusal:
        headers = self.grant(limits, 0, now)
        headers.requests_standing = standings.get("requests", headers.requests_standing)
        headers.tokens_standing = standings.get("tokens", headers.tokens_standing)
        wait = frees_at - now if frees_at != window.NEVER else float(window.BUCKETS)
        return refusal(dim, self.key_id, limit, used, units, wait, headers.headers())

    def settle(self, grant: Grant, tokens_used: int, now: float, pending: Changes) -> None:
        if grant.limits.max_inflight is not None:
            self.slots.release()
        delta = tokens_used - grant.tokens
        if grant.limits.tpm is not None and delta:
            window.add(self.own["tokens"], grant.bucket, delta, window.bucket_of(now))
            pending.add(self.key_id, "tokens", grant.bucket, delta)

    def flush(self, now: float, changes: Changes, refresh: bool, final: bool = False) -> None:
        """Return the leases of past buckets; on `refresh`, the slots that stayed idle since
        the last one, and report the slots held (so their expiry moves on); `final`: every
        lease and idle slot goes back."""
        bucket = window.bucket_of(now)
        for dim, lease in list(self.leases.items()):
            if lease.bucket != bucket or final:
                changes.add(self.key_id, dim, lease.bucket, -lease.unspent)
                del self.leases[dim]
        if refresh or final:  # idle for a whole refresh interval: let go
            self.slots.shed()
        if final:
            self.slots.held = self.slots.used
        held = self.slots.held
        if not self.taking and (held != self.held_sent or (refresh and held > 0)):
            changes.held[self.key_id] = held
            self.held_sent = held

    def idle(self, now: float) -> bool:
        bucket = window.bucket_of(now)
        return (
            not self.leases
            and not self.taking
            and self.slots.held == 0
            and self.slots.used == 0
            and self.held_sent == 0
            and all(window.used(own, bucket) == 0 for own in self.own.values())
        )
