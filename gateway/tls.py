"""TLS contexts built from the config: the listeners' server side and the units' client side.

The config has already checked that every file named loads (gateway/config/tls.py); this module
only builds the contexts. A unit's context is built once per set of files and shared by the
request path and the unit's probes and canary, so what routes a request is what was probed.
Certificates are read at start (or when a unit is added): replacing the files needs a restart.
"""

from __future__ import annotations

import functools
import ssl

from gateway.config import UnitConfig

# The gateway speaks HTTP/1.1 on both sides; saying so keeps an ALPN-aware peer off HTTP/2.
_ALPN = ["http/1.1"]


def server_context(cert: str, key: str) -> ssl.SSLContext | None:
    """A listener's context from its `tls_cert` and `tls_key`, or None for plain HTTP."""
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(_ALPN)
    return context


def unit_context(unit: UnitConfig) -> ssl.SSLContext | None:
    """What verifies the unit's https:// nodes (its `tls_ca`, else the system's trust store)
    and presents its client certificate (`tls_cert`, `tls_key`); None when no node is https."""
    if not any(url.startswith("https://") for url in (unit.leader, *unit.nodes)):
        return None
    return client_context(unit.tls_ca, unit.tls_cert, unit.tls_key)


@functools.lru_cache(maxsize=256)
def client_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """A verifying client context (hostname and chain); one per set of files."""
    context = ssl.create_default_context(cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key)
    context.set_alpn_protocols(_ALPN)
    return context


def scheme(context: ssl.SSLContext | None) -> str:
    return "http" if context is None else "https"
