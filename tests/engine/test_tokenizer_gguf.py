"""The tokenizer rebuilt from SmolLM2's GGUF metadata, against transformers' from the file.

On text where whitespace meets a number the two differ on purpose: the file names the
`smollm` split rule (digits on their own first, as llama.cpp and SmolLM2's tokenizer.json
do); transformers 5.24 has no entry for it and falls back to GPT-2's regex. Those cases
are pinned to the model's rule in their own test.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.model.gguf import GGUFFile, gguf_tokenizer, packaged_file
from engine.model.tokenizer import TemplatedTokenizer

CORPUS = [
    "Hello, world!",
    "I need running shoes for flat feet. What should I look for?",
    " leading space",
    "trailing space ",
    "Don't stop; it's fine -- really?! (yes) [no] {maybe} <tag> \"quoted\" 'single'",
    "Prices: $19.99, 3 for 2, 50% off, order #12345 on 2024-01-31 at 10:30.",
    "emoji 🙂👍🏽🚀 and flags 🇫🇷, CJK 你好世界, accents héllo wörld, Ελληνικά, русский",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))  # 3\n",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "tabs\tand\nnewlines\r\nmixed",
    "URL https://example.com/path?q=1&r=two and e-mail a.b@example.org",
    "ALL CAPS, CamelCase, snake_case, kebab-case",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
]
CHATS = [
    [{"role": "user", "content": "I need running shoes for flat feet. What should I look for?"}],
    [
        {"role": "system", "content": "You are brief."},
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4 🙂"},
        {"role": "user", "content": "And 3 * 3?"},
    ],
]


@pytest.fixture(scope="module")
def ours() -> TemplatedTokenizer:
    return gguf_tokenizer(GGUFFile(packaged_file("smollm2")))


@pytest.fixture(scope="module")
def reference() -> Any:
    from transformers import AutoTokenizer

    path = packaged_file("smollm2")
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
def test_ids_equal_transformers(ours: TemplatedTokenizer, reference: Any, text: str) -> None:
    assert ours.encode(text) == reference.encode(text, add_special_tokens=False)


@pytest.mark.slow
def test_decode_round_trips(ours: TemplatedTokenizer, reference: Any) -> None:
    for text in CORPUS:
        ids = ours.encode(text)
        expected = reference.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids) == expected
        if "<|" not in text:
            assert ours.decode(ids) == text


@pytest.mark.slow
@pytest.mark.parametrize("messages", CHATS)
def test_chat_template_equals_transformers(
    ours: TemplatedTokenizer, reference: Any, messages: list[dict[str, str]]
) -> None:
    """The file's template, rendered in the engine's sandbox, then encoded."""
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(expected, dict) or hasattr(expected, "input_ids"):
        expected = expected["input_ids"]
    assert ours.apply_chat_template(messages) == list(expected)


def test_specials_and_stops(ours: TemplatedTokenizer) -> None:
    assert (ours.bos_id, ours.eos_id, ours.vocab_size) == (1, 2, 49152)
    assert ours.bos_token == "<|im_start|>" and ours.eos_token == "<|im_end|>"
    assert ours.stop_ids == {2}
    assert ours.encode("<|im_start|>") == [1]
    assert ours.decode([1, *ours.encode("hi"), 2]) == "hi"


def test_numbers_follow_the_files_split_rule(ours: TemplatedTokenizer) -> None:
    """`smollm`: every number character is its own piece before GPT-2's regex runs, so a
    whitespace run before a digit stays one run (transformers 5.24: ĠĠ Ġ 4 2)."""
    tokens = ours.tok.encode("   42", add_special_tokens=False).tokens
    assert tokens == ["ĠĠĠ", "4", "2"]
    assert ours.tok.encode("a  1", add_special_tokens=False).tokens == ["a", "ĠĠ", "1"]
    assert ours.tok.encode("x 12345", add_special_tokens=False).tokens == [
        "x",
        "Ġ",
        "1",
        "2",
        "3",
        "4",
        "5",
    ]
