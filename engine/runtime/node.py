"""One node of a unit: parse flags, join the group, build this rank's shard, then either run
the follower loop or hand back a started LeaderEngine for the HTTP server.

Followers run as `python -m engine.runtime.node --role follower ...`. `--role leader` here is a
bare leader (engine + /health, no OpenAI server) for smoke tests; `unitgate node` wires the
real one together with the server through `start_leader`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from engine.device import select_device
from engine.model import (
    ByteTokenizer,
    HFTokenizer,
    ModelConfig,
    Tokenizer,
    TPContext,
    Transformer,
    init_from_seed,
    load_hf_folder,
)
from engine.runtime.follower import run_follower
from engine.runtime.group import destroy_unit_group, init_unit_group
from engine.runtime.health import NodeStats, serve_health, stop_health
from engine.runtime.leader import LeaderEngine

log = logging.getLogger("engine.runtime.node")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.runtime.node", description=__doc__)
    p.add_argument("--role", choices=("leader", "follower"), required=True)
    p.add_argument("--unit", default="unit-0")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--master", default="127.0.0.1:29500", help="leader's rendezvous host:port")
    p.add_argument(
        "--health-host", default="127.0.0.1", help="(`unitgate node` leader: default --host)"
    )
    p.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="/health on a thread of its own; 0 picks a free port (`unitgate node` leader: "
        "unset = /health on the API port only)",
    )
    p.add_argument("--model", default="tiny", help="'tiny' (seeded) or a Hugging Face folder")
    p.add_argument("--seed", type=int, default=0, help="weights seed for --model tiny")
    p.add_argument("--num-slots", type=int, default=8)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--collective-timeout", type=float, default=10.0, help="seconds")
    p.add_argument("--connect-timeout", type=float, default=300.0, help="seconds")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    return p


def build_model(args: argparse.Namespace, tp: TPContext) -> tuple[Transformer, Tokenizer, str]:
    """The rank's shard, the tokenizer and the served model name."""
    device, dtype = select_device(args.device, args.dtype)
    if args.model == "tiny":
        config = ModelConfig.tiny()
        if args.max_seq_len is not None:
            config = replace(config, max_seq_len=args.max_seq_len)
        model = init_from_seed(config, args.seed, tp, args.num_slots, device, dtype)
        return model, ByteTokenizer(), "tiny"
    folder = Path(args.model)
    if not folder.is_dir():
        raise ValueError(f"model: {args.model!r} is neither 'tiny' nor a folder")
    model = load_hf_folder(folder, tp, args.num_slots, device, dtype, args.max_seq_len)
    return model, HFTokenizer(folder), folder.name


def _build_then_join(args: argparse.Namespace) -> tuple[Transformer, Tokenizer, str]:
    """Load first, join after: the group's collective timeout starts ticking once every rank
    has joined, so a rank still reading a big checkpoint must not leave the others waiting
    in a broadcast. Joining waits up to --connect-timeout for the slowest loader."""
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    tp = TPContext(rank=args.rank, world_size=args.world_size)  # group None: the world, later
    built = build_model(args, tp)
    init_unit_group(
        args.rank, args.world_size, args.master, args.collective_timeout, args.connect_timeout
    )
    return built


def start_leader(args: argparse.Namespace) -> LeaderEngine:
    """Build rank 0's shard, join, start the engine thread; `shutdown()` tears the group down."""
    if args.rank != 0:
        raise ValueError(f"rank: the leader is rank 0, got {args.rank}")
    model, tokenizer, name = _build_then_join(args)
    engine = LeaderEngine(
        model,
        tokenizer,
        model_name=name,
        unit=args.unit,
        heartbeat_s=args.collective_timeout / 4,
        teardown=destroy_unit_group,
    )
    return engine.start()


def run_follower_node(args: argparse.Namespace) -> int:
    """Serve /health, then mirror the leader's steps until STOP (0) or losing it (1)."""
    if args.rank == 0:
        raise ValueError("rank: followers are ranks 1..world_size-1, got 0")
    model, _, _ = _build_then_join(args)
    stats = NodeStats("follower", args.unit, args.rank, model.cache.num_slots)
    server = serve_health(stats.snapshot, args.health_host, args.health_port)
    print(f"health_port={server.server_port}", flush=True)
    try:
        code = run_follower(model, stats)
    finally:
        stop_health(server)
    if code == 0:  # after a lost leader, tearing down could block on the dead peer
        destroy_unit_group()
    return code


def _serve_bare_leader(args: argparse.Namespace) -> int:
    """Engine plus /health until SIGTERM or SIGINT, then STOP the followers."""
    engine = start_leader(args)
    server = serve_health(engine.health, args.health_host, args.health_port)
    print(f"health_port={server.server_port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    stop_health(server)
    engine.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    if args.role == "leader":
        return _serve_bare_leader(args)
    return run_follower_node(args)


if __name__ == "__main__":
    sys.exit(main())
