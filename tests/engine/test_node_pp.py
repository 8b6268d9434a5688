"""Pipelined units of real `unitgate node` processes on SmolLM2: greedy answers identical to
one node's at pp 2, pp 3 and tp 2 x pp 2, with several streams at once (so the leader keeps
micro-batches of them in flight), a tied stream's too, and SIGTERM stopping every node with
exit code 0.

Each node loads only its stage's layers of the packaged GGUF (the file's blocks) and joins a
real Gloo group on loopback; the answers are read with the official client.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from openai import OpenAI

from gateway.base.ports import free_port
from tests.engine.test_up_support import Proc, unitgate

pytestmark = pytest.mark.slow

FLAGS = ("--model", "smollm2", "--weight-dtype", "gguf", "--max-seq-len", "256")
NODE = ("--threads", "1", "--num-slots", "4", "--collective-timeout", "30", *FLAGS)
QUESTIONS = (
    "I need running shoes for flat feet.",
    "What is the capital of France?",
    "Name three colours of the rainbow.",
)
MAX_TOKENS = 16


def start(tmp: Path, world: int, pp: int) -> list[Proc]:
    """Followers first, then the leader (rank 0) with its API on a free port."""
    master = f"127.0.0.1:{free_port()}"
    shape = ("--world-size", str(world), "--pp", str(pp), "--master", master, "--unit", "pp")
    nodes = []
    for rank in range(world - 1, -1, -1):
        role = "leader" if rank == 0 else "follower"
        where = ("--port", str(free_port())) if rank == 0 else ()
        name = f"w{world}pp{pp}r{rank}"
        args = ("node", "--role", role, "--rank", str(rank), *shape, *NODE, *where)
        nodes.append(unitgate(tmp, name, *args))
    return nodes[::-1]


def answers(leader: Proc) -> list[str]:
    port = int(leader.wait_line("api_port=", 120))
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120)

    def ask(question: str) -> str:
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        return reply.choices[0].message.content or ""

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        texts = list(pool.map(ask, QUESTIONS))
    # A tied stream (its head at the start: the pipelined leader announces it too) gives the
    # same greedy answer as the plain request.
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": QUESTIONS[0]}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        extra_headers={"x-unitgate-tied": "1"},
    )
    tied = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert tied == texts[0], (tied, texts[0])
    return texts


def run_unit(tmp: Path, world: int, pp: int) -> list[str]:
    nodes = start(tmp, world, pp)
    try:
        texts = answers(nodes[0])
        nodes[0].proc.send_signal(signal.SIGTERM)
        for rank, node in enumerate(nodes):
            assert node.proc.wait(30) == 0, f"rank {rank}: {node.tail()}"
        return texts
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    texts = run_unit(tmp_path_factory.mktemp("one"), 1, 1)
    assert all(len(t.split()) >= 5 for t in texts), texts
    assert len(set(texts)) == len(texts), texts
    return texts


@pytest.mark.parametrize(("world", "pp"), [(2, 2), (3, 3), (4, 2)], ids=["pp2", "pp3", "tp2xpp2"])
def test_greedy_answers_identical_to_one_node(
    world: int, pp: int, one_node: list[str], tmp_path: Path
) -> None:
    assert run_unit(tmp_path, world, pp) == one_node
