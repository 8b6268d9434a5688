"""The per-process limiter the request path calls: `admit`, then `settle` when the answer ends.

Policy, in one place:

- Window: at most `rpm` admissions, and `tpm` tokens, in any 60 s span (window.py: 1 s
  buckets, 61 counted). A refusal names the limit, `Retry-After` is the whole seconds until
  enough of the window frees up (at least 1), and `x-ratelimit-reset-*` is when the window
  would be empty (OpenAI's "resets to its initial state"; whole seconds rounded up, "6m0s",
  or milliseconds below one); on a refusal, the refused limit's reset is no earlier than the
  retry. `remaining` is the fleet's count at this process's last take, less what its lease
  spent since.
- Tokens: the caller's estimate is reserved at admission and settled with the real count when
  the answer ends (a client that left is charged what was generated): the difference goes to
  the bucket the estimate went into (a refund never below 0), batched to the store.
- In flight: at most `max_inflight` admitted and not yet settled, across the fleet: each
  process holds slots under its name with an expiry, so a dead one's slots are let go.
- Round trips: `admit` awaits the store only when the key's leases do not cover the request
  (lease.py), and a burst waits for the one take in progress; a refusal is remembered until
  the bucket ends; returns, settles and held slots go in one `push` per flush interval. A take
  in a new second first hands back what the last second's lease left unspent (one push more),
  or the store would count it against the take and refuse a burst under its limit.
- Store away (`StoreDown` from a take or a push): from then on each replica admits against its
  share, limit // live replicas (at least 1), counting what it admitted itself in the last
  minute; logged once, `degraded` is True. Every flush probes the store; the first push that
  succeeds replays what was admitted meanwhile into the shared window (so the fleet does not
  admit the minute twice) and the limiter is back on the store. For the minute after, a
  replica keeps to its own share as well as the shared count: the others' replays reach the
  store a flush or two later, and until then the shared count is short. Never unlimited,
  never an exception to the request path.

What the policy does not promise:

- A replica cut off from a store the others still reach admits its share on top of what the
  store admits; the replay then holds the others back until it leaves the window.
- A Redis that lost its data (no persistence) restarts the window from what was replayed.
- A replica that dies strands its unspent lease (at most `lease_max_*`, and a share of the room
  far from the limit; one unit near it) until the bucket leaves the window: the fleet admits
  that much less for a minute, never more.
- The buckets are wall-clock seconds of each replica: their clocks must agree to well within
  a second (NTP does). `live_replicas` should keep answering the last count it knew while the
  store is away (the replicas report through it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.config.limits import LimitsConfig
from gateway.limits import window
from gateway.limits.account import Account, Need, needs
from gateway.limits.decisions import Grant, KeyLimits, Refusal
from gateway.limits.store import Ask, Changes, Store, StoreDown

log = logging.getLogger("unitgate.limits")

STOP_WITHIN_S = 5.0  # `close` waits this long at most for the flush loop to end
CENSUS_EVERY = 0.5  # seconds between this process's reports to the store's census (a fresh
# replica is counted by the others within this, so their shares while the store is away are right)


class Limiter:
    def __init__(
        self,
        store: Store,
        config: LimitsConfig | None = None,
        *,
        live_replicas: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.time,
        ways: int = 1,
    ) -> None:
        """`live_replicas`: the processes sharing the store (None: the store's own census,
        taken every CENSUS_EVERY seconds, the last count kept while the store is away).
        `ways`: every key's limits are split this many ways, this process enforcing its part
        alone (the workers of a replica without a shared store)."""
        self.store = store
        self.config = config or LimitsConfig()
        self.processes = 1  # the store's last census
        self.live_replicas = live_replicas or (lambda: self.processes)
        self.clock = clock
        self.ways = ways
        self.accounts: dict[str, Account] = {}
        self.pending = Changes()
        self.degraded = False  # the store is away: local shares apply (a metric reads it)
        self.takes = self.pushes = 0  # store round trips made, for metrics and the benchmark
        self._refreshed = -float("inf")
        self._recovered_at = -float("inf")  # when the store last came back
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._landing: dict[str, asyncio.Future[None]] = {}  # a take in progress, by key
        self._work = asyncio.Event()  # set when an account opens: a parked flush loop wakes

    async def admit(
        self, key_id: str, limits: KeyLimits, tokens: int, now: float
    ) -> Grant | Refusal:
        """Admit one request of `key_id` asking `tokens` (the estimate of prompt + completion)
        at `now`, wall-clock seconds (time.time(): the buckets are shared by every replica).
        Awaits the store only when this process's leases do not cover the request."""
        tokens = max(0, tokens)
        limits = limits.share(self.ways)
        wanted = needs(limits, tokens)
        if not wanted:
            return Grant(key_id, limits, window.bucket_of(now), tokens, now)
        account = self.accounts.get(key_id) or self._open(key_id)
        bucket = window.bucket_of(now)
        if now - self._recovered_at <= window.SPAN_S + 1 and not self.degraded:
            # The minute after an outage: the others' replays may not have reached the store
            # yet, so this replica also keeps to its own share (the fleet stays within limits).
            over = account.over_share(limits, tokens, now, self._replicas())[2]
            if over is not None:
                return over
        while True:
            if self.degraded:
                return account.fallback(limits, tokens, now, self._replicas(), self.pending)
            reserved, missing = account.reserve(wanted, bucket)
            landing = self._landing.get(key_id)
            if not missing or landing is None:
                break
            # Another request of this key is taking a lease now: a burst waits for it rather
            # than sending a take each (one round trip, then the lease covers the rest).
            account.undo(reserved, bucket, self.pending)
            await asyncio.shield(landing)
            account = self.accounts.setdefault(key_id, account)
        if missing and account.blocked:
            blocked, answers = account.still_blocked(missing, now)
            if blocked:
                account.undo(reserved, bucket, self.pending)
                return account.refused(limits, blocked, answers, now, tokens)
        if missing:
            refused = await self._take(account, limits, tokens, now, reserved, missing)
            if refused is not None:
                return refused
        account.record(wanted, bucket)
        return account.grant(limits, tokens, now)

    def settle(self, grant: Grant, tokens_used: int) -> None:
        """The answer ended with `tokens_used` (prompt + completion): release its in-flight
        slot and charge the difference from the estimate. Idempotent; never blocks."""
        if grant.settled or not grant.limits.any():
            return
        grant.settled = True
        account = self.accounts.get(grant.key_id) or self._open(grant.key_id)
        account.settle(grant, max(0, tokens_used), self.clock(), self.pending)

    def _open(self, key_id: str) -> Account:
        account = self.accounts[key_id] = Account(key_id)
        self._work.set()
        return account

    @staticmethod
    def headers(answer: Grant | Refusal) -> dict[str, str]:
        """The x-ratelimit-* headers of an answer (a refusal's with its Retry-After)."""
        return answer.headers()

    async def _take(
        self,
        account: Account,
        limits: KeyLimits,
        tokens: int,
        now: float,
        reserved: list[Need],
        missing: list[Need],
    ) -> Grant | Refusal | None:
        """Ask the store for what the leases did not cover: None when granted (applied)."""
        bucket = window.bucket_of(now)
        asks = [
            Ask(dim, limit, units, self._cap(dim), self._fraction())
            for dim, limit, units in missing
        ]
        account.taking += 1
        landing = asyncio.get_running_loop().create_future()
        self._landing.setdefault(account.key_id, landing)
        stale = account.return_stale(missing, bucket)
        try:
            if stale is not None:  # first, or the store counts them against this take
                self.pushes += 1
                await self.store.push(stale, now)
                stale = None
            self.takes += 1
            answers = await self.store.take(account.key_id, asks, now)
        except StoreDown as exc:
            if stale is not None:  # not handed back: the next push (or replay) carries it
                self._keep(stale)
            account.undo(reserved, bucket, self.pending)
            self._degrade(exc)
            return account.fallback(limits, tokens, now, self._replicas(), self.pending)
        finally:
            account.taking -= 1
            if self._landing.get(account.key_id) is landing:
                del self._landing[account.key_id]
            landing.set_result(None)
        if any(a.granted == 0 for a in answers):
            account.undo(reserved, bucket, self.pending)
            account.remember(missing, answers, now, self.config.flush_interval)
            return account.refused(limits, missing, answers, now, tokens)
        account.apply(missing, answers, bucket, self.pending)
        return None

    async def flush(self, now: float, final: bool = False) -> None:
        """Send the returns, settles and held slots gathered since the last flush; while the
        store is away this is also the probe that finds it back. `final`: every lease goes
        back, and the slots no request holds."""
        refresh = now - self._refreshed >= self.config.slots_ttl / 4
        changes, self.pending = self.pending, Changes()
        for key_id, account in list(self.accounts.items()):
            account.flush(now, changes, refresh, final)
            if account.idle(now):
                del self.accounts[key_id]
        oldest = window.bucket_of(now) - window.SPAN_S
        changes.deltas = {k: d for k, d in changes.deltas.items() if k[2] >= oldest}
        if refresh:
            self._refreshed = now
        if not changes and not self.degraded:
            return
        try:
            self.pushes += 1
            await self.store.push(changes, now)
        except StoreDown as exc:
            self._keep(changes)
            self._degrade(exc)
            return
        except asyncio.CancelledError:  # `close` stopped the loop mid-push: its flush sends it
            self._keep(changes)
            raise
        if self.degraded:
            self.degraded = False
            self._recovered_at = now
            log.warning("limits: the store answers again; back on the shared limits")

    def _keep(self, changes: Changes) -> None:
        """Changes a push did not deliver go out with the next one (newer ones on top)."""
        changes.merge_under(self.pending)
        self.pending = changes

    def start(self) -> None:
        """Flush every `flush_interval` in the background, until `close`."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="limits-flush")

    async def close(self) -> None:
        """Stop flushing, hand back what this process holds (a last flush), close the store."""
        self._stopping = True
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            # A redis-py call may swallow a cancellation: the loop then ends at its next turn
            # (`_stopping`), and this wait is bounded either way.
            await asyncio.wait({task}, timeout=STOP_WITHIN_S)
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("limits: the flush loop had failed: %r", task.exception())
        await self.flush(self.clock(), final=True)
        await self.store.close()

    async def _run(self) -> None:
        counted = -float("inf")
        while not self._stopping:
            if self._idle():
                self._work.clear()
                await self._work.wait()
                continue
            now = self.clock()
            if now - counted >= CENSUS_EVERY:
                counted = now
                try:
                    self.processes = await self.store.census(now)
                except StoreDown:
                    pass  # the last count stands meanwhile
                except Exception:  # a bug must not stop the flushes
                    log.exception("limits: the census failed")
            await asyncio.sleep(self.config.flush_interval)
            try:
                await self.flush(self.clock())
            except Exception:  # a bug must not stop the returns and settles for good
                log.exception("limits: a flush failed; what it was sending is lost")

    def _idle(self) -> bool:
        """Nothing to flush and no census to keep (a store nobody else reads): the loop parks
        until an account opens, so a gateway whose keys have no limits never wakes for it."""
        return not (self.store.shared or self.accounts or self.pending or self.degraded)

    def _degrade(self, exc: StoreDown) -> None:
        if not self.degraded:
            self.degraded = True
            log.warning(
                "limits: the store is unreachable (%s); each replica enforces its share "
                "(limit // %d live replicas) until it answers",
                exc,
                self._replicas(),
            )

    def _replicas(self) -> int:
        return max(1, self.live_replicas())

    def _cap(self, dim: str) -> int:
        if dim == "tokens":
            return self.config.lease_max_tokens
        return self.config.lease_max_requests

    def _fraction(self) -> float:
        return self.config.lease_share / self._replicas()
