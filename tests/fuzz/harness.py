"""Real sockets for the HTTP fuzz tests: a gateway subprocess, a scripted raw unit, a raw client.

Everything is synchronous (threads and blocking sockets with deadlines) so hypothesis drives the
examples directly; the gateway runs in its own process, which lets the tests read its RSS and
its stderr (no traceback may appear there).
"""

from __future__ import annotations

import contextlib
import re
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools
import orjson

from gateway.base.readyfile import wait_ready_blocking
from tests.support import MODEL, ROOT, SimProcess, session_ranking_first

CHAT = "/v1/chat/completions"


# -- the client side -------------------------------------------------------------------------


@dataclass
class Reply:
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False  # a whole response was parsed
    closed: bool = False  # the gateway closed the connection
    elapsed: float = 0.0

    def json(self) -> Any:
        return orjson.loads(self.body)


class _Parser:
    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.parser = httptools.HttpResponseParser(self)
        self.parts: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.reply.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.reply.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        if self.reply.status is not None and self.reply.status < 200:  # 100 Continue: interim
            self.reply.status = None
            self.reply.headers.clear()
            self.parts.clear()
            return
        self.reply.complete = True


def exchange(
    port: int,
    pieces: list[tuple[bytes, float]],
    *,
    half_close: bool = False,
    deadline: float = 10.0,
    stall: Callable[[], None] | None = None,
) -> Reply:
    """Send `pieces` (bytes, then a pause in seconds), read one response until it is complete
    or the gateway closes. Raises AssertionError if neither happens within `deadline` s.

    `stall`, if given, is called once after the first bytes arrived: a client that stops
    reading for as long as it runs."""
    reply = Reply()
    parser = _Parser(reply)
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=deadline) as sock:
        try:
            for data, pause in pieces:
                if data:
                    sock.sendall(data)
                if pause:
                    time.sleep(pause)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway answered early (413, 400) and closed: read what it said
        while not reply.complete:
            left = start + deadline - time.monotonic()
            assert left > 0, f"the gateway neither answered nor closed within {deadline} s"
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except TimeoutError:
                raise AssertionError(
                    f"the gateway neither answered nor closed within {deadline} s"
                ) from None
            if not data:
                reply.closed = True
                break
            if stall is not None:
                stall()
                stall = None
            try:
                parser.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                break
    reply.body = b"".join(parser.parts)
    reply.elapsed = time.monotonic() - start
    return reply


def post_head(
    length: int | None, *, session: str, request_id: str = "", extra: bytes = b""
) -> bytes:
    head = f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"x-session-id: {session}\r\n"
    if request_id:
        head += f"x-request-id: {request_id}\r\n"
    if length is not None:
        head += f"Content-Length: {length}\r\n"
    return head.encode() + extra + b"\r\n"


def post(port: int, body: bytes, *, session: str, request_id: str = "", **kw: Any) -> Reply:
    head = post_head(len(body), session=session, request_id=request_id)
    return exchange(port, [(head + body, 0.0)], **kw)


# -- a unit that says exactly what the test scripts ------------------------------------------


@dataclass
class Script:
    """One scripted answer: raw bytes written in pieces, then how the connection ends."""

    pieces: list[tuple[bytes, float]]
    end: str  # keep | close | reset | stall


class RawUnit:
    """A threaded HTTP/1.1 server answering each request by the script for its x-request-id.

    Unknown ids get a plain 503, so a request routed here by mistake fails visibly."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        self.lock = threading.Lock()
        unit = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                unit._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def expect(self, request_id: str, script: Script) -> None:
        with self.lock:
            self.scripts[request_id] = script

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(10.0)
        buf = b""
        with contextlib.suppress(OSError):
            while True:
                while b"\r\n\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                fields = dict(
                    line.split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
                )
                fields = {k.lower(): v for k, v in fields.items()}
                length = int(fields.get(b"content-length", b"0"))
                while len(buf) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                rid = fields.get(b"x-request-id", b"").decode()
                with self.lock:
                    script = self.scripts.pop(rid, None)
                if script is None:
                    sock.sendall(b"HTTP/1.1 503 Unknown\r\nContent-Length: 0\r\n\r\n")
                    continue
                for data, pause in script.pieces:
                    sock.sendall(data)
                    if pause:
                        time.sleep(pause)
                if script.end == "keep":
                    continue
                if script.end == "reset":
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.close()  # now, before socketserver's orderly shutdown sends a FIN
                elif script.end == "stall":
                    sock.settimeout(5.0)
                    with contextlib.suppress(OSError):
                        while sock.recv(65536):  # until the gateway gives up and closes
                            pass
                return


# -- the gateway process ---------------------------------------------------------------------


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    sessions: dict[str, str]  # unit id -> an x-session-id that routes to it first

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def escaped_errors(self) -> list[str]:
        """Log records of exceptions that escaped the gateway's own code (each one a 500).

        Not counted, because aiohttp logs them itself and the client already has its 400:
        requests its HTTP parser refuses (no gateway frame in the traceback), and a broken
        body's stored error re-raised while aiohttp drains ("lingers" on) the rest of it.
        """
        records = re.split(r"\n(?=\d{4}-\d\d-\d\d )", self.log_text())
        return [
            r
            for r in records
            if f'File "{ROOT}/gateway/' in r and "in start\n    await payload.readany()" not in r
        ]


# Small limits so abuse is cheap to produce and every wait is short; first_byte and idle stay
# far above the simulated units' 5 ms / 4 ms so a busy CI machine cannot trip the control stream.
MAX_BODY = 64 * 1024
TIMEOUTS = {"connect": 1.0, "first_byte": 1.5, "idle": 1.0, "total": 4.0}
DEADLINE = TIMEOUTS["total"] + 4.0  # nothing may take longer than the gateway's own limits
DONE = b"data: [DONE]\n\n"


def check_error(reply: Reply) -> None:
    """An OpenAI-shaped JSON error answer."""
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert reply.headers.get("content-type", "").startswith("application/json")


def start_gateway(tmp: Path, sim: SimProcess, raw: RawUnit) -> GatewayProcess:
    units = [{"id": "raw", "leader": raw.url, "nodes": [raw.url]}] + [
        {"id": u["id"], "leader": u["leader"], "nodes": u["nodes"]} for u in sim.units[:2]
    ]
    lines = [
        f'[gateway]\nport = 0\nmodels = ["{MODEL}"]\nmax_body_bytes = {MAX_BODY}\n'
        "shutdown_timeout = 2.0\n",
        "[metrics]\nport = 0\n",
        "[admin]\nenabled = false\n",
        "[health]\nenabled = false\n",
        "[breaker]\nenabled = false\n",
        '[routing]\naffinity = "session"\n',
        "[retry]\nmax_attempts = 1\n",  # every answer comes from the unit first chosen
        "[timeouts]\n" + "".join(f"{k} = {v}\n" for k, v in TIMEOUTS.items()),
    ]
    for unit in units:
        nodes = ", ".join(f'"{n}"' for n in unit["nodes"])
        lines.append(
            f'[[units]]\nid = "{unit["id"]}"\nleader = "{unit["leader"]}"\nnodes = [{nodes}]\n'
        )
    cfg = tmp / "gw.toml"
    cfg.write_text("\n".join(lines))
    ready = tmp / "gw.ready.json"
    log = tmp / "gw.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "gateway", "gateway", "--config", str(cfg)),
                *("--ready-file", str(ready), "--log-level", "warning"),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    info = wait_ready_blocking(ready, proc, 30.0, "the gateway")
    ids = [u["id"] for u in units]
    sessions = {i: session_ranking_first(i, [o for o in ids if o != i]) for i in ids}
    port = int(info["public"].rsplit(":", 1)[1])
    return GatewayProcess(proc, port, log, sessions)


# -- a control stream that must stay byte-identical ------------------------------------------


class ControlStreams:
    """Streams one fixed request to unit u1 through the gateway, over and over, in a thread.

    Every stream must complete and equal `reference` (the same request sent to the unit
    directly) byte for byte, whatever the fuzzed clients next to it do."""

    def __init__(self, gw: GatewayProcess, reference: bytes, body: bytes) -> None:
        self.gw, self.reference, self.body = gw, reference, body
        self.stop = threading.Event()
        self.done = 0
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                reply = post(
                    self.gw.port, self.body, session=self.gw.sessions["u1"], request_id="control"
                )
            except AssertionError as exc:
                self.failures.append(str(exc))
                continue
            if reply.status != 200 or not reply.complete or reply.body != self.reference:
                self.failures.append(f"{reply.status} {reply.complete} {reply.body[-200:]!r}")
            else:
                self.done += 1

    def __enter__(self) -> ControlStreams:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive(), "the control stream hung"
        assert not self.failures, self.failures[:3]
        assert self.done >= 1, "no control stream completed"


def reference_stream(sim: SimProcess, body: bytes) -> bytes:
    """The control request answered by unit u1 directly (what the gateway must relay)."""
    leader = sim.units[1]["leader"]
    port = int(leader.rsplit(":", 1)[1])
    head = post_head(len(body), session="direct", request_id="control")
    reply = exchange(port, [(head + body, 0.0)])
    assert reply.status == 200 and reply.complete
    assert reply.body.endswith(b"data: [DONE]\n\n")
    return reply.body


# The fixture that hands a test the control streams running beside it.
Control = Callable[[], ControlStreams]
