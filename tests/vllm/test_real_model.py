"""vLLM serves the real SmolLM2-135M-Instruct as a three-node unit (TP=3 across leader and
two followers: 9 query heads and 3 KV heads divide by 3, not by 2), from the Hugging Face
folder `engine.model.export` writes out of the packaged GGUF.

The answer is checked against the builtin engine's own greedy answer from the GGUF file: two
implementations, two formats, one model. Then the leader is stopped, and both followers must
exit on their own: vLLM's headless node would wait for its leader forever. (The same unit
serves both checks: a vLLM unit takes over a minute to start here.)
"""

from __future__ import annotations

import signal
from functools import partial
from pathlib import Path

import pytest
from openai import OpenAI

from engine.model import TPContext
from engine.model.export import main as export
from engine.model.gguf import GGUFFile, gguf_tokenizer, load_gguf, packaged_file
from tests.engine.test_up_support import eventually
from tests.vllm.support import group_gone, start_unit

pytestmark = [
    pytest.mark.slow,
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("vllm_required"),
]
MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 12


def builtin_answer() -> str:
    """Greedy decoding by the builtin engine from the GGUF, to the model's own end."""
    file = GGUFFile(packaged_file("smollm2"))
    tokenizer = gguf_tokenizer(file)
    model = load_gguf(file, TPContext(), num_slots=1, max_seq_len=256)
    prompt = tokenizer.apply_chat_template(QUESTION)
    logits, ids = model([(0, prompt, 0)]), []
    for pos in range(len(prompt), len(prompt) + MAX_TOKENS):
        ids.append(int(logits[0].argmax()))
        if ids[-1] in tokenizer.stop_ids:
            ids.pop()
            break
        logits = model([(0, [ids[-1]], pos)])
    return tokenizer.decode(ids)


def test_a_three_node_unit_serves_the_real_model_and_ends_with_its_leader(tmp_path: Path) -> None:
    folder = tmp_path / "smollm2-hf"
    assert export([str(folder), "--model", "smollm2"]) == 0
    expected = builtin_answer()
    assert "Paris" in expected  # a real model's answer, not noise
    unit = start_unit(tmp_path, folder, "u0", world=3, served=MODEL)
    try:
        unit.wait_ready()
        client = OpenAI(base_url=f"{unit.api}/v1", api_key="unused", timeout=300, max_retries=0)
        response = client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        assert response.choices[0].message.content == expected
        unit.leader.proc.send_signal(signal.SIGTERM)
        assert unit.leader.proc.wait(timeout=90) == 0, unit.leader.tail()
        for follower in unit.followers:
            assert follower.proc.wait(timeout=90) == 1, follower.tail()  # 1: it lost its leader
            assert "gone for" in follower.text()
        for node in unit.procs:  # no engine core or worker outlives its node
            eventually(partial(group_gone, node), 30, f"{node.out.name} group ends")
    finally:
        unit.stop()
