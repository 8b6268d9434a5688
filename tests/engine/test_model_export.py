"""The packaged SmolLM2 GGUF exported as a Hugging Face folder (engine/model/export.py): one
model in two formats. The builtin engine gives the very same logits from the folder as from
the file; transformers loads the folder on its own (no GGUF support involved) and agrees
with it; the folder's tokenizer is the engine's, ids and chat template alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.model import TPContext
from engine.model.export import main
from engine.model.gguf import GGUFFile, gguf_tokenizer, load_gguf, packaged_file
from engine.model.tokenizer import HFTokenizer
from engine.model.weights import load_hf_folder

pytestmark = pytest.mark.slow

QUESTION = [
    {"role": "user", "content": "I need running shoes for flat feet. What should I look for?"}
]
CORPUS = ["Hello, world!", "   42 apples", "emoji 🏃‍♀️ and code: def f(x): return x**2", "\tend"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2-hf")
    assert main([str(out), "--model", "smollm2"]) == 0
    return out


def test_the_folder_has_what_transformers_and_vllm_read(folder: Path) -> None:
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert {"chat_template.jinja", "generation_config.json"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    shape = (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"])
    assert shape == (9, 3, 64) and config["tie_word_embeddings"] is True


def test_the_engine_computes_the_same_from_the_folder_as_from_the_file(folder: Path) -> None:
    prompt = gguf_tokenizer(GGUFFile(packaged_file("smollm2"))).apply_chat_template(QUESTION)
    from_file = load_gguf(GGUFFile(packaged_file("smollm2")), TPContext(), 1, max_seq_len=128)
    from_folder = load_hf_folder(folder, TPContext(), 1, max_seq_len=128)
    assert torch.equal(from_file([(0, prompt, 0)]), from_folder([(0, prompt, 0)]))


def test_transformers_loads_the_folder_and_agrees(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = HFTokenizer(folder)
    theirs = AutoTokenizer.from_pretrained(folder)
    for text in CORPUS:
        assert theirs.encode(text, add_special_tokens=False) == ours.encode(text), text
    prompt = ours.apply_chat_template(QUESTION)
    rendered = theirs.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert theirs.encode(rendered, add_special_tokens=False) == prompt
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0, -1]
    engine = load_hf_folder(folder, TPContext(), 1, max_seq_len=128)
    torch.testing.assert_close(engine([(0, prompt, 0)])[0], expected, atol=1e-3, rtol=0)
