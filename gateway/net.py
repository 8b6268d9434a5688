"""Small network facts shared by the admin API and the local cluster launcher."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; names other than localhost are not resolved."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Listen backlog of every server here (the kernel caps it at net.core.somaxconn, 4096 on
# current kernels). aiohttp's default of 128 overflows when thousands of streams arrive at
# once: the kernel then drops SYNs, and clients see connects time out while the server idles.
LISTEN_BACKLOG = 4096

# Seconds an idle client connection is kept open between requests (aiohttp's default).
KEEPALIVE_S = 75.0
