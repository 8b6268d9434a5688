"""`unitgate node --model smollm2` as a real 2-node unit: a streamed answer in English.

The whole path on the real model: each process loads its own shard of the packaged GGUF
(rank 0: 2 KV groups, rank 1: 1), the leader renders the file's chat template with the
engine's tokenizer, and the official client reads the stream.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from openai import OpenAI

from gateway.base.ports import free_port
from tests.engine.test_node_cli import node

pytestmark = pytest.mark.slow

FLAGS = ("--model", "smollm2", "--max-seq-len", "256", "--num-slots", "2")


def test_two_nodes_stream_a_real_answer(tmp_path: Path) -> None:
    master, port = f"127.0.0.1:{free_port()}", free_port()
    follower = node(tmp_path, "follower", 1, master, *FLAGS)
    leader = node(tmp_path, "leader", 0, master, "--port", str(port), *FLAGS)
    try:
        leader.wait_line("api_port=", 90)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60)
        assert [m.id for m in client.models.list()] == ["SmolLM2-135M-Instruct"]
        stream = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "I need running shoes for flat feet."}],
            stream=True,
            max_tokens=24,
            temperature=0,
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        words = text.split()
        assert " shoe" in text and len(words) >= 10, text
        assert sum(w.isascii() for w in words) / len(words) > 0.9, text
        leader.proc.send_signal(signal.SIGTERM)
        assert leader.proc.wait(20) == 0, leader.tail()
        assert follower.proc.wait(20) == 0, follower.tail()
    finally:
        leader.stop()
        follower.stop()
