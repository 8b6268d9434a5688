"""`unitgate node`: one node of a unit, as its own process (`--backend builtin` or `vllm`).

The leader is rank 0 plus the OpenAI server, which also answers /health; given --health-port
it answers /health there too, from a thread that does not queue behind the API's streams (the
gateway then probes that port). A follower mirrors the leader's steps and answers /health on
its own port. `unitgate up` starts these locally; on real hosts an operator (or a
LeaderWorkerSet) starts one per host.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

from engine.api import Engine, GenerationRequest, TokenEvent
from engine.backends.vllm import VllmMissing
from engine.backends.vllm.args import add_flags as add_vllm_flags
from engine.model.tokenizer import Tokenizer
from engine.runtime import node

log = logging.getLogger("engine.cli")


def build_parser() -> argparse.ArgumentParser:
    p = node.build_parser()
    p.prog, p.description = "unitgate node", __doc__
    p.add_argument("--host", default="127.0.0.1", help="leader: OpenAI API and /health host")
    p.add_argument("--port", type=int, default=8000, help="leader: API port (0 picks a free one)")
    p.add_argument(
        "--served-model-name",
        default=None,
        help="leader: the model id clients send (default: the model's own name)",
    )
    add_vllm_flags(p)
    # Unset means: a leader answers /health on the API port only, on the API's host.
    p.set_defaults(health_port=None, health_host=None)
    return p


def resolve_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """A follower always serves /health (on a free port unless told); a leader's health
    listener shares the API's host, as the config's `nodes[0]` shares `leader`'s."""
    leader = args.role == "leader"
    if args.health_host is None:
        args.health_host = args.host if leader else "127.0.0.1"
    if args.health_port is None and not leader:
        args.health_port = 0
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad flags before loading weights or waiting minutes for peers to join."""
    if args.world_size < 1:
        raise ValueError(f"--world-size: must be >= 1, got {args.world_size}")
    if not 0 <= args.rank < args.world_size:
        raise ValueError(f"--rank: must be in 0..{args.world_size - 1}, got {args.rank}")
    if (args.role == "leader") != (args.rank == 0):
        want = "0" if args.role == "leader" else f"1..{args.world_size - 1}"
        raise ValueError(f"--rank: a {args.role} has rank {want}, got {args.rank}")
    host, _, port = args.master.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--master: expected HOST:PORT, got {args.master!r}")
    for flag, value in (("--port", args.port), ("--health-port", args.health_port)):
        if value is not None and not 0 <= value <= 65535:
            raise ValueError(f"{flag}: must be 0..65535, got {value}")
    if args.num_slots < 1:
        raise ValueError(f"--num-slots: must be >= 1, got {args.num_slots}")
    for flag, seconds in (
        ("--collective-timeout", args.collective_timeout),
        ("--connect-timeout", args.connect_timeout),
    ):
        if not seconds > 0:
            raise ValueError(f"{flag}: must be > 0 seconds, got {seconds}")


class ServedAs:
    """The same engine under another model id: the gateway forwards request bodies unchanged,
    so the leader must accept the id the gateway routes by (like vLLM's --served-model-name)."""

    def __init__(self, engine: Engine, name: str) -> None:
        self._engine, self._name = engine, name

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def tokenizer(self) -> Tokenizer:
        return self._engine.tokenizer

    @property
    def max_seq_len(self) -> int:
        return self._engine.max_seq_len

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        return self._engine.generate(request)

    def abort(self, request_id: str) -> None:
        self._engine.abort(request_id)

    def health(self) -> dict[str, Any]:
        return self._engine.health()


def run_leader(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; then stop serving first, so no request lands on an engine
    that is broadcasting STOP, and shut the engine down (the followers exit 0)."""
    import uvloop

    from engine.server.run import health_at, serve_until_signal

    engine = node.start_leader(args)
    served: Engine = engine
    if args.served_model_name:
        served = ServedAs(engine, args.served_model_name)
    try:
        uvloop.run(serve_until_signal(served, args.host, args.port, health_at(args)))
    finally:
        engine.shutdown(timeout=10.0)
    log.info("leader of unit %s stopped", args.unit)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = resolve_defaults(build_parser().parse_args(argv))
    try:
        check_args(args)
        if args.backend == "vllm":
            from engine.backends.vllm.node import run_node

            return run_node(args)
        if args.role == "follower":
            return node.run_follower_node(args)
        return run_leader(args)
    except (ValueError, VllmMissing) as exc:
        print(f"unitgate node: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. the API port is taken
        print(f"unitgate node: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
