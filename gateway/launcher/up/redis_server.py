"""The redis-server `unitgate up --replicas N` runs for its replicas to share admin state.

Debian's redis-server, started like every child of `up` (own session, killed if `up` dies). It
listens on a Unix socket only this user may open (permissions 700) and on no TCP port, so
there is no port to race for and nothing to authenticate. It keeps an append-only file in
the log dir, so overrides outlive a restart of `up` on the same `--log-dir`, as the SQLite
state file does for one gateway. It is stopped last, after the gateways drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

import redis.asyncio as redis
from redis.exceptions import RedisError

from gateway.launcher.up.processes import spawn, terminate

log = logging.getLogger("unitgate.up")
INSTALL_HINT = "apt-get install redis-server"
SUN_PATH_MAX = 100  # a Unix socket path longer than ~107 bytes cannot be bound
POLL_S = 0.02


class StoreFailed(RuntimeError):
    """redis-server did not start; the message says why and where its log is."""


def find_redis_server() -> str | None:
    return shutil.which("redis-server")


class LocalRedis:
    def __init__(self, binary: str, log_dir: Path) -> None:
        self.folder = log_dir / "redis"
        self.log = self.folder / "redis.log"
        self._own_dir: Path | None = None  # a short folder for the socket, removed at stop
        socket = self.folder / "redis.sock"
        if len(str(socket)) > SUN_PATH_MAX:
            self._own_dir = Path(tempfile.mkdtemp(prefix="unitgate-redis-"))
            socket = self._own_dir / "redis.sock"
        self.socket = socket
        self._binary = binary
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def argv(self) -> list[str]:
        return [
            *(self._binary, "--port", "0", "--unixsocket", str(self.socket)),
            *("--unixsocketperm", "700", "--dir", str(self.folder)),
            *("--appendonly", "yes", "--appendfsync", "everysec", "--save", ""),
            *("--daemonize", "no", "--loglevel", "notice"),
        ]

    async def start(self, within: float = 10.0) -> None:
        """Returns once it answers PING; StoreFailed if it exits or stays silent `within` s."""
        await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)
        self._proc = await spawn(self.argv(), self.log, {})
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1.0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        try:
            while not await _pong(client):
                if self._proc.returncode is not None:
                    raise StoreFailed(
                        f"redis-server exited with {self._proc.returncode} at start "
                        f"(its log: {self.log})"
                    )
                if loop.time() > deadline:
                    raise StoreFailed(
                        f"redis-server silent after {within:g} s (its log: {self.log})"
                    )
                await asyncio.sleep(POLL_S)
        finally:
            await client.aclose()
        log.info("redis-server (pid %d) listening on %s", self._proc.pid, self.url)

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM (it writes its append-only file and removes its socket), then SIGKILL."""
        if self._proc is not None:
            await terminate(self._proc, grace)
        await asyncio.to_thread(self._clean)

    def _clean(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)


async def _pong(client: redis.Redis) -> bool:
    try:
        return bool(await client.ping())
    except (RedisError, OSError):
        return False
