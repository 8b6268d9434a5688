"""Record streamed answers of the builtin engine and of the simulated units (tests/data/streams).

Re-runnable from a checkout: `python tests/data/streams/record.py [--only builtin|sim]`. It
starts what it needs on 127.0.0.1 (a 2-node builtin unit on the packaged SmolLM2 model, and
`unitgate sim` with one unit), sends each request the way the gateway sends a resumable
stream to a unit (the client's body plus `"return_token_ids": true`, with the gateway's own
request head), writes every de-chunked response body byte for byte as `<source>_<api>_<variant>
.sse`, then `index.json`, and stops what it started. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from gateway.proxy.continuation import continuation, with_token_ids  # noqa: E402

OUT = Path(__file__).resolve().parent
MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
READY_S = 180.0  # both builtin nodes import torch and load the GGUF at once on 2 cores
ANSWER_S = 120.0
STOP_S = 20.0
RESUME_AFTER = 5  # generated tokens a recorded continuation takes as already committed
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Variant:
    name: str  # <api>_<variant>
    path: str
    body: JSON  # the client's body; the gateway adds return_token_ids
    client_ids: bool = False


@dataclass(slots=True)
class Answer:
    status: int
    head: bytes
    body: bytes
    broken: bool  # the connection failed before the body's end

    @property
    def events(self) -> list[bytes]:
        return [e for e in self.body.split(b"\n\n") if e]

    @property
    def ends(self) -> str:
        if self.broken:
            return "reset"
        if self.body.endswith(b"data: [DONE]\n\n"):
            return "done"
        events = self.events
        if events and events[-1].startswith(b'data: {"error"'):
            return "error"
        return "eof"

    def payloads(self) -> list[JSON]:
        out: list[JSON] = []
        for event in self.events:
            data = event.removeprefix(b"data: ")
            if data != b"[DONE]" and data.startswith(b"{"):
                out.append(orjson.loads(data))
        return out


@dataclass(slots=True)
class Recorder:
    out: Path
    entries: list[JSON] = field(default_factory=list)

    def write(self, source: str, variant: Variant, sent: bytes, answer: Answer) -> None:
        name = f"{source}_{variant.name}.sse"
        if answer.status != 200:
            raise RuntimeError(f"{name}: HTTP {answer.status}: {answer.body[:500]!r}")
        (self.out / name).write_bytes(answer.body)
        request = orjson.loads(sent)
        self.entries.append(
            {
                "file": name,
                "source": source,
                "path": variant.path,
                "chat": variant.path == CHAT,
                "client_ids": variant.client_ids,
                "include_usage": (request.get("stream_options") or {}).get("include_usage") is True,
                "request": request,
                "ends": answer.ends,
            }
        )
        print(f"{name}: {len(answer.body)} bytes, {len(answer.events)} events, {answer.ends}")


# -- the requests --

FRUITS = [{"role": "user", "content": "Name three fruits."}]
USAGE = {"include_usage": True}


def chat(messages: list[JSON], **extra: Any) -> JSON:
    return {"model": MODEL, "messages": messages, "stream": True, **extra}


def common_variants() -> list[Variant]:
    """What both sources are asked."""
    return [
        Variant("chat_plain", CHAT, chat(FRUITS, temperature=0, max_tokens=30)),
        Variant(
            "chat_usage",
            CHAT,
            chat(FRUITS, stream_options=USAGE, temperature=0, max_tokens=30),
        ),
        Variant(
            "completions_usage",
            COMPLETIONS,
            {
                "model": MODEL,
                "prompt": "The capital of France is",
                "stream": True,
                "stream_options": USAGE,
                "temperature": 0,
                "max_tokens": 30,
            },
        ),
        Variant(
            "chat_client_ids",
            CHAT,
            chat(FRUITS, stream_options=USAGE, temperature=0, max_tokens=30, return_token_ids=True),
            client_ids=True,
        ),
        Variant(
            "chat_length",
            CHAT,
            chat(FRUITS, stream_options=USAGE, temperature=0, max_tokens=5),
        ),
    ]


def builtin_variants() -> list[Variant]:
    return [
        *common_variants(),
        Variant(
            "chat_utf8_accents",
            CHAT,
            chat(
                [{"role": "user", "content": "Write three French words with accents, like café."}],
                stream_options=USAGE,
                temperature=0,
                max_tokens=30,
            ),
        ),
        Variant(
            "chat_utf8_emoji",
            CHAT,
            chat(
                [
                    {
                        "role": "user",
                        "content": "Reply with only emoji: a happy face, a heart and a rocket.",
                    }
                ],
                stream_options=USAGE,
                temperature=0,
                max_tokens=30,
            ),
        ),
        Variant(
            "chat_stop",
            CHAT,
            chat(FRUITS, stream_options=USAGE, temperature=0, max_tokens=30, stop=["rang"]),
        ),
    ]


def sim_variants() -> list[Variant]:
    return [
        *common_variants(),
        Variant("chat_default_tokens", CHAT, chat(FRUITS, stream_options=USAGE, temperature=0)),
    ]


ERROR_VARIANT = Variant(
    "chat_error_midstream",
    CHAT,
    chat(
        [{"role": "user", "content": "Write a long story about a cat."}],
        stream_options=USAGE,
        temperature=0,
        max_tokens=50,
        ignore_eos=True,
    ),
)
DROP_VARIANT = Variant(
    "chat_drop",
    CHAT,
    chat(FRUITS, stream_options=USAGE, temperature=0, max_tokens=30),
)


def resume_of(answer: Answer, variant: Variant) -> tuple[Variant, bytes]:
    """The gateway's continuation of `answer` had it broken after RESUME_AFTER tokens."""
    payloads = answer.payloads()
    prompt: list[int] = list(payloads[0]["prompt_token_ids"])
    done: list[int] = []
    for p in payloads:
        for choice in p.get("choices", []):
            done += choice.get("token_ids") or []
    done = done[:RESUME_AFTER]
    budget = int(variant.body["max_tokens"])
    sent = continuation(variant.body, MODEL, prompt + done, budget - len(done), len(done))
    return Variant("completions_continuation", COMPLETIONS, orjson.loads(sent)), sent


# -- HTTP, as the gateway speaks it to a leader --


async def post(
    port: int,
    path: str,
    body: bytes,
    request_id: str,
    after_events: tuple[int, Callable[[], None]] | None = None,
) -> Answer:
    """POST with the gateway's request head; the body de-chunked, kept up to a broken end.
    `after_events` runs its callback once that many SSE events have arrived."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nAccept: */*\r\nContent-Length: {len(body)}\r\n"
        f"x-request-id: {request_id}\r\n\r\n"
    ).encode("latin-1")
    writer.write(head + body)
    await writer.drain()
    got = bytearray()
    broken = False
    fired = after_events is None
    try:
        raw_head = await reader.readuntil(b"\r\n\r\n")
        status = int(raw_head.split(b" ", 2)[1])
        lines = raw_head.lower().split(b"\r\n")
        chunked = b"transfer-encoding: chunked" in lines
        length = [int(h.split(b":", 1)[1]) for h in lines if h.startswith(b"content-length:")]
        try:
            if not chunked:
                got += await (reader.readexactly(length[0]) if length else reader.read())
            while chunked:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass
                    break
                try:
                    got += await reader.readexactly(size)
                except asyncio.IncompleteReadError as exc:
                    got += exc.partial
                    raise
                await reader.readexactly(2)
                if not fired and after_events and got.count(b"\n\n") >= after_events[0]:
                    fired = True
                    after_events[1]()
        except (asyncio.IncompleteReadError, ConnectionError):
            broken = True
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return Answer(status, bytes(raw_head), bytes(got), broken)


async def get_status(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    try:
        line = await reader.readline()
        return int(line.split(b" ", 2)[1])
    finally:
        writer.close()


async def record(
    rec: Recorder,
    source: str,
    port: int,
    variant: Variant,
    sent: bytes | None = None,
    after_events: tuple[int, Callable[[], None]] | None = None,
) -> Answer:
    sent = with_token_ids(variant.body) if sent is None else sent
    rid = f"corpus-{source}-{variant.name.replace('_', '-')}"
    async with asyncio.timeout(ANSWER_S):
        answer = await post(port, variant.path, sent, rid, after_events)
    rec.write(source, variant, sent, answer)
    return answer


# -- processes --


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, name: str, logs: Path, *args: str) -> Child:
        log = logs / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", *args],
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(name, proc, log)

    async def line(self, prefix: str, within: float) -> str:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line.removeprefix(prefix)
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.tail()}")
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.name}: no {prefix!r} line in {within:g} s: {self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.kill()
                self.proc.wait(STOP_S)


async def wait_healthy(port: int, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, IndexError):
            if await get_status(port, "/health") == 200:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"127.0.0.1:{port}/health not 200 within {within:g} s")


async def builtin(rec: Recorder, logs: Path, threads: int) -> None:
    """A 2-node unit (the follower is what the mid-stream error needs: killed mid-answer)."""
    master = f"127.0.0.1:{free_port()}"
    common = [
        *("--unit", "corpus", "--world-size", "2", "--master", master, "--model", "smollm2"),
        *("--threads", str(threads), "--num-slots", "2", "--max-seq-len", "512"),
        *("--collective-timeout", "10"),
    ]
    follower = Child.start("follower", logs, "node", "--role", "follower", "--rank", "1", *common)
    leader = Child.start(
        "leader", logs, "node", "--role", "leader", "--rank", "0", *common,
        "--host", "127.0.0.1", "--port", "0", "--served-model-name", MODEL,
    )  # fmt: skip
    try:
        port = int(await leader.line("api_port=", READY_S))
        await wait_healthy(port, READY_S)
        answers: dict[str, Answer] = {}
        for variant in builtin_variants():
            answers[variant.name] = await record(rec, "builtin", port, variant)
        resume, sent = resume_of(answers["chat_usage"], common_variants()[1])
        await record(rec, "builtin", port, resume, sent)
        # Last: the unit fails once its follower is gone, in-flight streams get an error event.
        await record(rec, "builtin", port, ERROR_VARIANT, after_events=(4, follower.kill))
    finally:
        leader.stop()
        follower.stop()


async def sim(rec: Recorder, logs: Path) -> None:
    ready = logs / "sim.ready.json"
    child = Child.start(
        "sim", logs, "sim", "--units", "1", "--followers", "0", "--ready-file", str(ready),
        "--ttft-ms", "5", "--itl-ms", "1", "--model", MODEL,
    )  # fmt: skip
    try:
        await child.line("unitgate-sim ready ", READY_S)
        info = json.loads(ready.read_text())
        unit = info["units"][0]
        port = int(unit["leader"].rsplit(":", 1)[1])
        control = int(info["control"].rsplit(":", 1)[1])
        answers: dict[str, Answer] = {}
        for variant in sim_variants():
            answers[variant.name] = await record(rec, "sim", port, variant)
        resume, sent = resume_of(answers["chat_usage"], common_variants()[1])
        await record(rec, "sim", port, resume, sent)
        fault = orjson.dumps({"mode": "drop", "after_tokens": 3, "count": 1})
        armed = await post(control, f"/units/{unit['id']}/fault", fault, "corpus-fault")
        if armed.status != 200:
            raise RuntimeError(f"fault not set: {armed.status} {armed.body!r}")
        await record(rec, "sim", port, DROP_VARIANT)
    finally:
        child.stop()


async def run(only: str | None, threads: int, logs: Path) -> list[JSON]:
    rec = Recorder(OUT)
    if only in (None, "builtin"):
        await builtin(rec, logs, threads)
    if only in (None, "sim"):
        await sim(rec, logs)
    return rec.entries


def write_index(only: str | None, entries: list[JSON]) -> None:
    index = OUT / "index.json"
    if only is not None and index.exists():  # keep the other source's entries
        entries += [e for e in json.loads(index.read_text()) if e["source"] != only]
    entries.sort(key=lambda e: str(e["file"]))
    index.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", choices=("builtin", "sim"))
    p.add_argument("--threads", type=int, default=1, help="torch threads per builtin node")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so the children are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="unitgate-corpus-") as folder:
        logs = Path(folder)
        try:
            entries = asyncio.run(run(args.only, args.threads, logs))
        except Exception:
            for log in sorted(logs.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    write_index(args.only, entries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
