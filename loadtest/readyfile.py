"""Waiting for a child that listens to say it can serve: `wait_http_ok` polls a URL (a
gateway's `/readyz`) until it answers 200. A child's ready file (that it listens, and where)
is gateway/base/readyfile.py's, which every writer and waiter uses."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request

POLL_S = 0.02


def wait_http_ok(
    url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0, what: str = "the process"
) -> None:
    """Poll `url` until it answers 200: a gateway's ready file says it listens, its `/readyz`
    says it can route (its units are unknown until a probe round has judged them)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before {url} said 200")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # 503 (not ready yet) is an HTTPError, a URLError
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {url} did not answer 200 within {timeout:g} s")
        time.sleep(POLL_S)
