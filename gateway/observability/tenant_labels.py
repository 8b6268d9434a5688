"""Which tenants get their own `tenant` label value: at most `top`, every other one "other".

A Prometheus label value is a series forever, and a counter's series must only go up, so a
label once given is kept (sticky) until the process restarts: a tenant's later requests are
never moved back to "other", and the sum over every label value is always the whole count.

How a tenant earns one: it must be a heavy hitter of the recent requests (refused ones too:
a tenant being throttled is one to see). A Space-Saving sketch (Metwally et al., 2005) of
`4 * top` counters follows the unlabelled tenants in constant memory; a tenant is promoted
when its guaranteed count (its counter minus the error it inherited on taking a slot over)
reaches both MIN_REQUESTS and `share` of the requests seen (default 1/(2 top): a tenant
with a twentieth of the traffic is promoted at `top = 10`). Every `decay_every` requests
the counts are halved, so "recent" means roughly the last few `decay_every` requests and a
tenant that grows late is still noticed.

Trade-offs: first come, first labelled. Once `top` labels are given none is taken back, so
a tenant that becomes heavy after the labels ran out stays in "other" until a restart (which
resets the counters anyway, and Prometheus reads that as a reset); a tenant that was heavy
and went quiet keeps its label. Promotion at a share, not a rank, means that among many
equal small tenants none is labelled: "other" then is the honest answer. Several worker
processes each decide on their own traffic: they see about the same tenants as heavy, but
the fleet's label values can be up to `workers * top` (docs/priority.md).

Cost per request: one dict lookup for a labelled tenant or once the labels ran out; for an
unlabelled one, the sketch's dict update, and an O(4 top) scan when a new tenant takes over
the smallest counter.
"""

from __future__ import annotations

OTHER = "other"
MIN_REQUESTS = 10  # no tenant is promoted on its first few requests, however quiet the rest


class TenantLabels:
    def __init__(self, top: int, share: float | None = None, decay_every: int = 0) -> None:
        self.top = top
        self.share = share if share is not None else 1.0 / (2 * max(top, 1))
        self.decay_every = decay_every or max(1000, 100 * top)
        self._labels: dict[str, str] = {}
        self._capacity = max(16, 4 * top)
        self._counts: dict[str, float] = {}  # the sketch: tenant -> count
        self._errors: dict[str, float] = {}  # what it inherited on taking over a counter
        self._seen = 0.0  # requests since start, halved with the counts
        self._until_decay = self.decay_every

    @property
    def labelled(self) -> frozenset[str]:
        return frozenset(self._labels)

    def label(self, tenant: str) -> str:
        """The tenant's label value as it stands (counts nothing)."""
        return self._labels.get(tenant, OTHER)

    def observe(self, tenant: str) -> str:
        """Count one request of `tenant`; its label value, promoted if it earned one now."""
        label = self._labels.get(tenant)
        if label is not None:
            self._tick()
            return label
        if len(self._labels) >= self.top or tenant == OTHER:  # a tenant named "other" is in it
            return OTHER
        self._tick()
        count = self._count(tenant)
        guaranteed = count - self._errors.get(tenant, 0.0)
        if guaranteed >= MIN_REQUESTS and guaranteed >= self.share * self._seen:
            self._labels[tenant] = tenant
            del self._counts[tenant]
            self._errors.pop(tenant, None)
            return tenant
        return OTHER

    def _tick(self) -> None:
        self._seen += 1
        self._until_decay -= 1
        if self._until_decay <= 0:
            self._until_decay = self.decay_every
            self._seen /= 2
            self._counts = {t: c / 2 for t, c in self._counts.items()}
            self._errors = {t: e / 2 for t, e in self._errors.items()}

    def _count(self, tenant: str) -> float:
        counts = self._counts
        count = counts.get(tenant)
        if count is not None:
            count = counts[tenant] = count + 1
            return count
        if len(counts) < self._capacity:
            counts[tenant] = 1.0
            return 1.0
        smallest = min(counts, key=counts.__getitem__)
        floor = counts.pop(smallest)
        self._errors.pop(smallest, None)
        counts[tenant] = floor + 1
        self._errors[tenant] = floor
        return floor + 1
