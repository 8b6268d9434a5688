"""A real redis-server for the tests (Debian's `redis-server`; `make test` installs it).

It listens on a Unix socket in the test's own folder and on no TCP port, so there is no port
to race for; it appends every write to its log with fsync (`appendfsync always`), so a
SIGKILL loses nothing and a restart on the same folder comes back with the same data, as a
production Redis with persistence does.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

READY_WITHIN_S = 10.0


@dataclass
class RedisServer:
    folder: Path
    password: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def socket(self) -> Path:
        return self.folder / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed (make test installs it)"
        argv = [binary, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        argv += ["--dir", str(self.folder), "--appendonly", "yes", "--appendfsync", "always"]
        argv += ["--save", "", "--loglevel", "warning"]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        client = redis.Redis(unix_socket_path=str(self.socket), password=self.password)
        deadline = time.monotonic() + READY_WITHIN_S
        while True:
            assert self.proc.poll() is None, f"redis-server exited with {self.proc.returncode}"
            with contextlib.suppress(redis.exceptions.ConnectionError, FileNotFoundError):
                if client.ping():
                    break
            assert time.monotonic() < deadline, "redis-server not ready in time"
            time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown save (the append-only file has every write)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.socket.unlink(missing_ok=True)

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), password=self.password)


@contextlib.contextmanager
def redis_server(folder: Path, password: str | None = None) -> Iterator[RedisServer]:
    folder.mkdir(parents=True, exist_ok=True)
    server = RedisServer(folder, password)
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.terminate()
            server.proc.wait(timeout=10)
