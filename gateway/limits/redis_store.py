"""The shared counts in Redis: every replica and worker of the fleet charges the same windows.

Layout, under `<key_prefix>:limits:<key id>:`:

- `requests`, `tokens`: hashes of bucket (whole seconds) -> count; buckets that left the
  window are deleted by the next take, and an idle key expires after 62 s;
- `inflight`: a hash of replica -> "held expires_at"; an entry past its expiry is not counted
  (and deleted), so a replica that died lets its slots go after `ttl`.

Each `take` and each `push` is one EVALSHA of a Lua script, atomic in Redis. The scripts mirror
window.py (`used`, `frees_at`, `empty_at`) and lease.lease_extra; the times are the caller's
(`now`), so replica clocks are assumed to agree to well within a bucket (NTP does).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from gateway.config.state import StateConfig
from gateway.limits.store import Answer, Ask, Changes, StoreDown

# A limiter reports itself every CENSUS_EVERY seconds (limiter.py); one silent for this long
# no longer counts among the processes sharing the limits.
CENSUS_KEPT = 3.0

TAKE = """
local now, replica, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local expires = string.format('%.17g', now + ttl)
local bucket = math.floor(now)
local oldest = bucket - 60
local looks, fits = {}, true
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 5
  local dim, limit, need = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local entries = redis.call('HGETALL', KEYS[i])
  local used, own, frees, empty = 0, 0, ARGV[1], ARGV[1]
  if dim == 'inflight' then
    for j = 1, #entries, 2 do
      local held, expires = string.match(entries[j + 1], '(%S+) (%S+)')
      if tonumber(expires) < now then
        redis.call('HDEL', KEYS[i], entries[j])
      else
        used = used + tonumber(held)
        if entries[j] == replica then own = tonumber(held) end
      end
    end
    if used + need > limit then fits, frees = false, 'later' end
  else
    local buckets, counts, newest = {}, {}, nil
    for j = 1, #entries, 2 do
      local b, c = tonumber(entries[j]), tonumber(entries[j + 1])
      if b < oldest then
        redis.call('HDEL', KEYS[i], entries[j])
      elseif b <= bucket then
        used = used + c
        table.insert(buckets, b)
        counts[b] = c
        if c > 0 and (newest == nil or b > newest) then newest = b end
      end
    end
    if newest ~= nil then empty = tostring(newest + 61) end
    if used + need > limit then
      fits, frees = false, 'inf'
      if need <= limit then
        table.sort(buckets)
        local left = used
        for _, b in ipairs(buckets) do
          left = left - counts[b]
          if left + need <= limit then frees = tostring(b + 61) break end
        end
      end
    end
  end
  looks[i] = {dim, limit, need, used, frees, empty, own}
end
local out = {}
for i = 1, #KEYS do
  local l = looks[i]
  local granted = 0
  if fits then
    local a = 3 + (i - 1) * 5
    local cap, fraction = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
    local room, extra = l[2] - l[4] - l[3], 0
    if room > 0 then extra = math.max(0, math.min(cap, math.floor(room * fraction))) end
    granted = l[3] + extra
    if l[1] == 'inflight' then
      redis.call('HSET', KEYS[i], replica, tostring(l[7] + granted) .. ' ' .. expires)
      redis.call('PEXPIRE', KEYS[i], math.ceil(ttl * 2000))
    else
      redis.call('HINCRBY', KEYS[i], tostring(bucket), granted)
      redis.call('PEXPIRE', KEYS[i], 62000)
    end
  end
  table.insert(out, tostring(granted))
  table.insert(out, tostring(l[4]))
  table.insert(out, l[5])
  table.insert(out, l[6])
end
return out
"""

PUSH = """
local now, replica, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local expires = string.format('%.17g', now + ttl)
local oldest = math.floor(now) - 60
for i = 1, #KEYS do
  local what, value = ARGV[2 + 2 * i], tonumber(ARGV[3 + 2 * i])
  if what == 'held' then
    if value > 0 then
      redis.call('HSET', KEYS[i], replica, tostring(value) .. ' ' .. expires)
      redis.call('PEXPIRE', KEYS[i], math.ceil(ttl * 2000))
    else
      redis.call('HDEL', KEYS[i], replica)
    end
  elseif tonumber(what) >= oldest then
    if redis.call('HINCRBY', KEYS[i], what, value) <= 0 then
      redis.call('HDEL', KEYS[i], what)
    else
      redis.call('PEXPIRE', KEYS[i], 62000)
    end
  end
end
return #KEYS
"""


class RedisStore:
    shared = True  # the fleet's counts: the census keeps every replica's share right

    def __init__(
        self, client: redis.Redis, prefix: str, replica: str, ttl: float, timeout: float
    ) -> None:
        # The store owns its client. One immediate retry (a pooled connection that died with
        # the server), no backoff: a call the store does not answer means the local shares
        # now, not a wait in the request path.
        client.set_retry(Retry(NoBackoff(), 1))
        self.client, self.prefix, self.replica = client, prefix, replica
        self.ttl, self.timeout = ttl, timeout
        self._take = client.register_script(TAKE)
        self._push = client.register_script(PUSH)
        self.ops = 0  # script calls made (each one round trip), for tests and the benchmark

    @classmethod
    def from_config(cls, config: StateConfig, slots_ttl: float) -> RedisStore:
        client = redis.Redis.from_url(config.url, **config.client_options())
        # One entry of in-flight slots per process: the workers of a replica share its name.
        process = f"{config.replica_name()}/{os.getpid()}"
        return cls(client, config.key_prefix, process, slots_ttl, config.timeout)

    def key(self, key_id: str, dim: str) -> str:
        return f"{self.prefix}:limits:{key_id}:{dim}"

    async def take(self, key: str, asks: Sequence[Ask], now: float) -> list[Answer]:
        args: list[str] = [repr(now), self.replica, repr(self.ttl)]
        for ask in asks:
            args += [ask.dim, str(ask.limit), str(ask.need), str(ask.cap), repr(ask.fraction)]
        keys = [self.key(key, ask.dim) for ask in asks]
        reply = await self._call(self._take, keys, args)
        values = [v.decode() if isinstance(v, bytes) else str(v) for v in reply]
        return [
            Answer(
                int(values[i]),
                int(values[i + 1]),
                _time(values[i + 2], now),
                _time(values[i + 3], now),
            )
            for i in range(0, len(values), 4)
        ]

    async def push(self, changes: Changes, now: float) -> None:
        keys: list[str] = []
        args: list[str] = [repr(now), self.replica, repr(self.ttl)]
        for (key_id, dim, bucket), delta in changes.deltas.items():
            keys.append(self.key(key_id, dim))
            args += [str(bucket), str(delta)]
        for key_id, held in changes.held.items():
            keys.append(self.key(key_id, "inflight"))
            args += ["held", str(held)]
        await self._call(self._push, keys, args)

    async def census(self, now: float) -> int:
        """One sorted set of processes by when they last reported: add this one, drop those
        silent for CENSUS_KEPT seconds, count (one transaction, one round trip)."""
        members = f"{self.prefix}:limits:processes"
        self.ops += 1
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.zadd(members, {self.replica: now})
                pipe.zremrangebyscore(members, "-inf", now - CENSUS_KEPT)
                pipe.zcard(members)
                pipe.expire(members, int(CENSUS_KEPT) + 1)
                _, _, count, _ = await asyncio.wait_for(pipe.execute(), self.timeout)
        except TimeoutError:
            raise StoreDown(f"redis gave no answer within {self.timeout:g} s") from None
        except (RedisError, OSError) as exc:
            raise StoreDown(f"redis: {type(exc).__name__}: {exc}") from None
        return max(1, int(count))

    async def close(self) -> None:
        await self.client.aclose()

    async def _call(self, script: Any, keys: list[str], args: list[str]) -> Any:
        self.ops += 1
        try:
            return await asyncio.wait_for(script(keys=keys, args=args), self.timeout)
        except TimeoutError:
            raise StoreDown(f"redis gave no answer within {self.timeout:g} s") from None
        except (RedisError, OSError) as exc:
            raise StoreDown(f"redis: {type(exc).__name__}: {exc}") from None


def _time(value: str, now: float) -> float:
    """A time from a script's reply: `now` echoed as the caller sent it (repr), "later" for
    in-flight slots (a second from now, as a guess: a release may come any time), "inf", or a
    bucket's end (whole seconds)."""
    if value == "later":
        return now + 1.0
    return now if value == repr(now) else float(value)
