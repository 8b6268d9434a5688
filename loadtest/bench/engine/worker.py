"""The measuring processes: `python -m loadtest.bench.engine.worker JOB --rank R ...`.

Each job runs in its own process so it owns its torch thread count and its Gloo world, and
writes one JSON result file (`--result`). Jobs:

  bcast    both ranks: the step message alone, ping-ponged (see `_bcast`).
  forward  both ranks: the tiny model's forward in lockstep, no runtime (see `_forward`).
  bare     both ranks: the same, with the step message sent before each forward.
  engine   rank 0 only: a LeaderEngine driven through `generate`, timed through its hooks.
  follower rank 1..: the real follower loop (`engine.runtime.follower.run_follower`) on a
           model whose forwards are stamped, so each step's forward start on every rank is
           known and the step can be split into model time and runtime time (see analyze).

Stamps that are compared across processes are CLOCK_MONOTONIC (`time.monotonic_ns`), which
Linux shares between processes.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import uvloop

from engine.api import GenerationRequest, TokenEvent
from engine.model import ByteTokenizer, ModelConfig, SeedSource, TPContext, Transformer
from engine.model.gguf import GGUFFile, GGUFSource, gguf_config, gguf_tokenizer, packaged_file
from engine.model.tokenizer import Tokenizer
from engine.model.transformer import Entry
from engine.runtime.follower import run_follower
from engine.runtime.group import destroy_unit_group, init_unit_group
from engine.runtime.health import NodeStats
from engine.runtime.leader import LeaderEngine
from engine.runtime.messages import StepMessage, receive, send
from engine.scheduler import SamplingParams

SEED = 0
NUM_SLOTS = 8
PROMPT = tuple(range(1, 17))  # 16 prompt tokens, ids inside the byte tokenizer's range
DECODE_TOKEN = 65
WARMUP_ROUNDS = 1
REAL_MAX_SEQ_LEN = 256  # KV positions for the real model: PROMPT plus --max-tokens fit


def decode_entries(batch: int, pos: int) -> list[tuple[int, tuple[int, ...], int]]:
    """A decode step of `batch` sequences in slots 0..batch-1, as the scheduler builds it."""
    return [(slot, (DECODE_TOKEN,), pos) for slot in range(batch)]


# -- bcast --


def _bcast(args: argparse.Namespace) -> dict[str, Any]:
    """Ping-pong, one iteration at a time so nothing queues: the leader stamps t0 and calls
    `send` (what `LeaderEngine._step` calls), the follower stamps t1 when `receive` (what
    `run_follower` calls) has returned the decoded message, then acks with a 1-value broadcast
    from rank 1 that the leader waits for (t2). Both stamps are CLOCK_MONOTONIC, which Linux
    shares between processes, so t1 - t0 is the true one-way latency of the step message."""
    rank, out = args.rank, {}
    ack = torch.zeros(1, dtype=torch.int64)
    for batch in args.batches:
        msg = StepMessage.step(decode_entries(batch, 16), pending=0, slots_used=batch)
        send_ns: list[int] = []
        stamps: list[int] = []
        rtt_ns: list[int] = []
        for i in range(args.warmup + args.iters):
            if rank == 0:
                t0 = time.monotonic_ns()
                send(msg)
                t_sent = time.monotonic_ns()
                dist.broadcast(ack, src=1)
                t2 = time.monotonic_ns()
                if i >= args.warmup:
                    stamps.append(t0)
                    send_ns.append(t_sent - t0)
                    rtt_ns.append(t2 - t0)
            else:
                got = receive()
                t1 = time.monotonic_ns()
                if got != msg:
                    raise RuntimeError("bcast: follower decoded a different message")
                dist.broadcast(ack, src=1)
                if i >= args.warmup:
                    stamps.append(t1)
        out[str(batch)] = {"stamps_ns": stamps, "send_call_ns": send_ns, "rtt_ns": rtt_ns}
    return out


# -- forward --


class TimedTransformer(Transformer):
    """The model with each forward stamped: the seeded tiny model, or the real SmolLM2 from
    its packaged GGUF (this rank's shard)."""

    def __init__(self, tp: TPContext, model: str = "tiny") -> None:
        if model == "tiny":
            super().__init__(ModelConfig.tiny(), tp, num_slots=NUM_SLOTS)
            self.load(SeedSource(self.config, SEED))
        else:
            file = GGUFFile(packaged_file(model))
            config = gguf_config(file, max_seq_len=REAL_MAX_SEQ_LEN)
            super().__init__(config, tp, num_slots=NUM_SLOTS)
            self.load(GGUFSource(file, config.head_dim))
        self.calls: list[tuple[int, int, int, int]] = []  # (entries, tokens, start, end) ns

    def forward(self, batch: Sequence[Entry]) -> torch.Tensor:
        t0 = time.monotonic_ns()
        logits = super().forward(batch)
        tokens = sum(len(e[1]) for e in batch)
        self.calls.append((len(batch), tokens, t0, time.monotonic_ns()))
        return logits


def _forward(args: argparse.Namespace, tp: TPContext, bare_loop: bool) -> dict[str, Any]:
    """Every rank runs the same rounds: prefill PROMPT into each slot (untimed), then
    `max_tokens - 1` decode steps at the positions the engine would use, each timed on its
    own. The ranks stay in lockstep through the all-reduces inside forward, exactly as in the
    runtime, but nothing is scheduled or sampled.

    `bare_loop`: before each decode forward the leader sends that step's message and the
    follower receives it, with the same send()/receive() as the runtime and the same stamps
    as `_bcast`: the step message on its own, but sent where a step sends it, right after a
    forward, instead of in a tight ping-pong. Its one-way latency is the floor a runtime
    cannot go below (measured here: about 1.5x the ping-pong's, since each side has just
    spent milliseconds computing)."""
    model = TimedTransformer(tp, args.model)
    out: dict[str, Any] = {}
    for batch in args.batches:
        times: list[int] = []
        stamps: list[int] = []
        send_ns: list[int] = []
        for rnd in range(WARMUP_ROUNDS + args.rounds):
            model([(slot, PROMPT, 0) for slot in range(batch)])
            for step in range(args.max_tokens - 1):
                entries = decode_entries(batch, len(PROMPT) + step)
                if bare_loop and tp.rank == 0:
                    msg = StepMessage.step(entries, pending=batch, slots_used=batch)
                    t0 = time.monotonic_ns()
                    send(msg)
                    t_sent = time.monotonic_ns()
                    if rnd >= WARMUP_ROUNDS:
                        stamps.append(t0)
                        send_ns.append(t_sent - t0)
                elif bare_loop:
                    entries = list(receive().entries)
                    if rnd >= WARMUP_ROUNDS:
                        stamps.append(time.monotonic_ns())
                model(entries)
                if rnd >= WARMUP_ROUNDS:
                    _, _, t0, t1 = model.calls[-1]
                    times.append(t1 - t0)
        out[str(batch)] = {"forward_ns": times, "stamps_ns": stamps, "send_call_ns": send_ns}
    return out


# -- engine --


class Stamped:
    """One end of the step channel with each call's (start, end) stamped, monotonic ns: the
    leader's send(), the follower's receive(), handed to the engine in their place."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.calls = fn, list[tuple[int, int]]()

    def __call__(self, *args: Any) -> Any:
        t0 = time.monotonic_ns()
        out = self.fn(*args)
        self.calls.append((t0, time.monotonic_ns()))
        return out


class StepLog:
    """Each engine step's stamps, heard through LeaderEngine's `on_step`: the schedule, the
    broadcast, the forward, sampling, the scheduler update and the token events, i.e. one
    whole step, split by the forward and send stamps taken during it.

    Rows: (entries, tokens, step start, step end, forward start, forward end, send start,
    send end), monotonic ns; the send stamps are 0 at world size 1 (nothing is sent)."""

    def __init__(self, model: TimedTransformer, sends: Stamped) -> None:
        self.model, self.sends = model, sends
        self.steps: list[tuple[int, ...]] = []
        self._forwards = self._sent = 0  # how many of each the previous step had seen

    def __call__(self, start: int, end: int) -> None:
        forwards, sent = len(self.model.calls), len(self.sends.calls)
        if forwards > self._forwards:
            entries, tokens, f0, f1 = self.model.calls[-1]
            s0, s1 = self.sends.calls[-1] if sent > self._sent else (0, 0)
            self.steps.append((entries, tokens, start, end, f0, f1, s0, s1))
        self._forwards, self._sent = forwards, sent


def _tokenizer(model: str) -> Tokenizer:
    """The real model's ids reach past the byte tokenizer: its own decodes them."""
    if model == "tiny":
        return ByteTokenizer()
    return gguf_tokenizer(GGUFFile(packaged_file(model)))


def timed_engine(
    model: TimedTransformer, tokenizer: Tokenizer, teardown: Callable[[], None] | None
) -> tuple[LeaderEngine, StepLog]:
    """A real LeaderEngine whose step channel and steps are stamped (its public hooks)."""
    sends = Stamped(send)
    log = StepLog(model, sends)
    engine = LeaderEngine(
        model,
        tokenizer,
        model_name="bench",
        heartbeat_s=2.5,
        teardown=teardown,
        send_step=sends,
        on_step=log,
    )
    return engine, log


async def _one(engine: LeaderEngine, rid: str, params: SamplingParams) -> dict[str, Any]:
    request = GenerationRequest(rid, PROMPT, params)
    t_submit = time.perf_counter_ns()
    stamps: list[int] = []
    tokens: list[int] = []
    last: TokenEvent | None = None
    async for event in engine.generate(request):
        if event.token_id is not None:
            stamps.append(time.perf_counter_ns())
            tokens.append(event.token_id)
        last = event
    if last is None or last.error is not None:
        raise RuntimeError(f"engine: request {rid} failed: {last}")
    return {"submit_ns": t_submit, "token_ns": stamps, "tokens": tokens}


async def _rounds(engine: LeaderEngine, log: StepLog, args: argparse.Namespace) -> dict[str, Any]:
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    out: dict[str, Any] = {}
    for batch in args.batches:
        rounds = []
        for rnd in range(WARMUP_ROUNDS + args.rounds):
            first_step = len(log.steps)
            jobs = [_one(engine, f"b{batch}-r{rnd}-{i}", params) for i in range(batch)]
            results = await asyncio.gather(*jobs)
            if rnd >= WARMUP_ROUNDS:
                steps = log.steps[first_step:]
                rounds.append({"requests": results, "first_step": first_step, "steps": steps})
        out[str(batch)] = rounds
    return out


def _engine(args: argparse.Namespace) -> dict[str, Any]:
    if args.world_size == 1:
        model = TimedTransformer(TPContext(), args.model)
        engine, log = timed_engine(model, _tokenizer(args.model), teardown=None)
    else:
        model = TimedTransformer(TPContext(rank=0, world_size=args.world_size), args.model)
        init_unit_group(0, args.world_size, args.master, args.timeout, args.timeout)
        engine, log = timed_engine(model, _tokenizer(args.model), teardown=destroy_unit_group)
    engine.start()
    try:
        out = uvloop.run(_rounds(engine, log, args))  # the loop the leader server runs on
    finally:
        engine.shutdown(timeout=args.timeout)
    health = engine.health()
    if health["status"] != "ok":
        raise RuntimeError(f"engine: unhealthy after the run: {health}")
    return out


def _follower(args: argparse.Namespace) -> dict[str, Any]:
    """The real follower loop until the leader's STOP; every forward it ran, stamped."""
    model = TimedTransformer(TPContext(rank=args.rank, world_size=args.world_size), args.model)
    init_unit_group(args.rank, args.world_size, args.master, args.timeout, args.timeout)
    stats = NodeStats("follower", "bench", args.rank, NUM_SLOTS)
    receives = Stamped(receive)
    code = run_follower(model, stats, receive_step=receives)
    if code != 0:
        raise RuntimeError(f"follower: run_follower exited {code}: {stats.snapshot()}")
    destroy_unit_group()
    # each forward with the receive() that returned its step message: the last one before it
    ends = [end for _, end in receives.calls]
    calls = [
        (*call, *receives.calls[bisect.bisect_right(ends, call[2]) - 1]) for call in model.calls
    ]
    return {"calls": calls}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.bench.engine.worker")
    p.add_argument("job", choices=("bcast", "forward", "bare", "engine", "follower"))
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--master", default="127.0.0.1:29500")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--model", default="tiny", choices=("tiny", "smollm2"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    info = {"job": args.job, "rank": args.rank, "world_size": args.world_size}
    info["torch_threads"] = torch.get_num_threads()
    if args.job == "engine":
        data = _engine(args)
    elif args.job == "follower":
        data = _follower(args)
    else:
        tp = init_unit_group(args.rank, args.world_size, args.master, args.timeout, args.timeout)
        try:
            if args.job == "bcast":
                data = _bcast(args)
            else:
                data = _forward(args, tp, bare_loop=args.job == "bare")
            if args.world_size > 1:
                dist.barrier()
        finally:
            destroy_unit_group()
    args.result.write_text(json.dumps({**info, "data": data}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
