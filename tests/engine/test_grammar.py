"""engine.grammar: grammar text for each kind of request, the backend's check, matchers and
masks, with ByteTokenizer (a wider model vocabulary) and SmolLM2's tokenizer."""

from __future__ import annotations

import json
import random
import re

import pytest
import torch

from engine.grammar import (
    GrammarBackend,
    GrammarError,
    Matcher,
    choice_grammar,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
    unpack_bits,
)
from engine.grammar.tokenizers import ll_tokenizer
from engine.model.tokenizer import ByteTokenizer
from tests.engine.grammar_support import (
    BYTE_MODEL_VOCAB,
    TOKENIZERS,
    allowed,
    token_ids,
    tokenizer_and_backend,
    walk,
)

CLOSERS = ['"', "}", "]", '"}', '"]', "}}", "]}"]
NAME_F = {"type": "object", "properties": {"name": {"const": "f"}}, "required": ["name"]}


def feed(name: str, grammar: str, text: str) -> tuple[GrammarBackend, Matcher]:
    tokenizer, backend = tokenizer_and_backend(name)
    matcher = backend.matcher(grammar)
    for token in tokenizer.encode(text):
        matcher.accept(token)
    return backend, matcher


@pytest.mark.parametrize("name", TOKENIZERS)
def test_json_object_walks_end_in_an_object(name: str) -> None:
    grammar, prefer = json_object_grammar(), token_ids(name, CLOSERS)
    texts = [walk(name, grammar, random.Random(seed), prefer=prefer) for seed in range(20)]
    finished = [text for text in texts if text is not None]
    assert len(finished) >= 15
    for text in finished:
        assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("name", TOKENIZERS)
def test_json_object_refuses_anything_else(name: str) -> None:
    tokenizer, backend = tokenizer_and_backend(name)
    matcher = backend.matcher(json_object_grammar())
    with pytest.raises(GrammarError, match="not allowed"):
        matcher.accept(tokenizer.encode("[")[0])


@pytest.mark.parametrize("name", TOKENIZERS)
def test_json_is_compact(name: str) -> None:
    grammar = json_schema_grammar(
        {"type": "object", "properties": {"a": {"type": "integer"}}}, True
    )
    _, matcher = feed(name, grammar, '{"a":1}')
    assert matcher.is_finished
    with pytest.raises(GrammarError):
        feed(name, grammar, '{"a": 1}')


@pytest.mark.parametrize("name", TOKENIZERS)
def test_lark_tool_call_with_embedded_schema(name: str) -> None:
    lark = f'start: "<tool_call>" %json{json.dumps(NAME_F)} "</tool_call>"'
    grammar, prefer = lark_grammar(lark), token_ids(name, CLOSERS)
    tokenizer_and_backend(name)[1].check(grammar)
    for seed in range(10):
        text = walk(name, grammar, random.Random(seed), prefer=prefer)
        assert text is not None
        call = re.fullmatch(r"<tool_call>(.*)</tool_call>", text, re.DOTALL)
        assert call, text
        assert json.loads(call.group(1))["name"] == "f"


@pytest.mark.parametrize("name", TOKENIZERS)
def test_text_or_call_is_one_grammar(name: str) -> None:
    lark = f'start: TEXT | "<tool_call>" %json{json.dumps(NAME_F)} "</tool_call>"\nTEXT: /[^<]+/'
    grammar = lark_grammar(lark)
    assert feed(name, grammar, "hello")[1].is_finished is False  # more text may follow
    assert feed(name, grammar, '<tool_call>{"name":"f"}</tool_call>')[1].is_finished


@pytest.mark.parametrize("name", TOKENIZERS)
def test_finished_grammar_allows_only_stop_tokens(name: str) -> None:
    tokenizer, _ = tokenizer_and_backend(name)
    backend, matcher = feed(name, json_schema_grammar(NAME_F, True), '{"name":"f"}')
    assert matcher.is_finished
    mask = backend.allocate(1)
    backend.fill([matcher], mask)
    assert set(allowed(backend, mask)) == set(tokenizer.stop_ids)
    for stop in tokenizer.stop_ids:
        matcher.accept(stop)
    with pytest.raises(GrammarError):
        matcher.accept(tokenizer.encode("x")[0])
    assert matcher.error is not None
    backend.fill([matcher], mask)
    # A failed matcher allows nothing, not the stop token alone: a cut answer must not pass
    # for a whole one (the runtime ends it with an error: NoTokenAllowed).
    assert allowed(backend, mask) == []


def test_a_grammar_compiled_to_no_output_is_refused_by_the_check() -> None:
    """0.25 is the schema's one value, and llguidance compiles it to an empty language: its
    matcher fails at the first mask, and allowed the stop token alone, the answer would be
    empty with finish_reason "stop"."""
    _, backend = tokenizer_and_backend("byte")
    schema = {"type": "number", "exclusiveMinimum": 0.125, "maximum": 0.25, "multipleOf": 0.125}
    grammar = json_schema_grammar(schema, True)
    with pytest.raises(GrammarError, match="nothing can be generated that the grammar allows"):
        backend.check(grammar)
    matcher = backend.matcher(grammar)
    mask = backend.allocate(1)
    backend.fill([matcher], mask)
    assert matcher.error is not None and allowed(backend, mask) == []
    backend.check(json_schema_grammar({**schema, "maximum": 0.375}, True))  # 0.25 and 0.375


def test_fill_mixes_free_and_constrained_rows() -> None:
    """Free rows allow every id the model has; constrained rows none past the tokenizer's."""
    byte, backend = tokenizer_and_backend("byte")
    matcher = backend.matcher(lark_grammar('start: "a" | <|user|>'))
    mask = torch.zeros(3, (BYTE_MODEL_VOCAB + 31) // 32, dtype=torch.int32)
    backend.fill([None, matcher, None], mask)
    bits = unpack_bits(mask, BYTE_MODEL_VOCAB)
    assert bits[0].all() and bits[2].all()
    assert bits[1].nonzero().flatten().tolist() == [ord("a"), ByteTokenizer().ids["<|user|>"]]
    assert (mask[1, (byte.vocab_size + 31) // 32 :] == 0).all()


def test_fill_refuses_a_wrong_buffer() -> None:
    _, backend = tokenizer_and_backend("byte")
    for bad in (
        torch.zeros(1, 3, dtype=torch.int32),
        torch.zeros(1, 16, dtype=torch.int64),
        torch.zeros(16, 2, dtype=torch.int32).t(),
    ):
        with pytest.raises(ValueError, match="bitmask"):
            backend.fill([None], bad)
    with pytest.raises(ValueError, match="bitmask"):
        backend.fill([None, None], backend.allocate(1))


@pytest.mark.parametrize("name", TOKENIZERS)
def test_check_resolves_special_tokens(name: str) -> None:
    """lark names special tokens; only the tokenizer knows which exist."""
    _, backend = tokenizer_and_backend(name)
    own = "<end>" if name == "byte" else "<|im_end|>"
    other = "<|im_end|>" if name == "byte" else "<end>"
    backend.check(lark_grammar(f'start: "a" {own}'))
    with pytest.raises(GrammarError, match="special token"):
        backend.check(lark_grammar(f'start: "a" {other}'))
    with pytest.raises(GrammarError, match="special token"):
        backend.matcher(lark_grammar(f'start: "a" {other}'))


def test_token_ids_past_the_tokenizer_cannot_be_named() -> None:
    _, backend = tokenizer_and_backend("byte")
    with pytest.raises(GrammarError, match="300"):
        backend.check(lark_grammar('start: "a" | <[300]>'))


def test_bad_grammars_fail_without_a_tokenizer() -> None:
    with pytest.raises(GrammarError, match="unknown name"):
        lark_grammar("start: missing")
    with pytest.raises(GrammarError, match="unclosed group"):
        regex_grammar("a(b")
    with pytest.raises(GrammarError, match="look-around"):
        regex_grammar("(?=a)a")
    with pytest.raises(GrammarError, match="at least one"):
        choice_grammar([])


@pytest.mark.parametrize("name", TOKENIZERS)
def test_regex_and_choice_walks(name: str) -> None:
    regex = regex_grammar(r"[a-c]{2,4}-\d{1,3}")
    choices = ["yes", "no", 'say "hi"', "back\\slash", "é🙂", "line\nbreak", ""]
    choice = choice_grammar(choices)
    for seed in range(8):
        text = walk(name, regex, random.Random(seed))
        assert text is not None and re.fullmatch(r"[a-c]{2,4}-\d{1,3}", text), text
        assert walk(name, choice, random.Random(seed)) in choices
    tokenizer, _ = tokenizer_and_backend(name)
    for text in choices:
        backend, matcher = feed(name, choice, text)
        mask = backend.allocate(1)
        backend.fill([matcher], mask)
        assert tokenizer.stop_ids <= set(allowed(backend, mask)), text


def test_model_vocab_below_tokenizer_is_refused() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        GrammarBackend(ByteTokenizer(), 100)


def test_llguidance_tokenizer_is_built_once_per_tokenizer() -> None:
    tok, backend = tokenizer_and_backend("smollm2")
    assert ll_tokenizer(tok) is ll_tokenizer(tok)
    assert ll_tokenizer(ByteTokenizer()) is not ll_tokenizer(ByteTokenizer())
    assert backend.vocab_size == ll_tokenizer(tok).vocab_size == 49152


def test_unpack_bits_reads_llguidance_layout() -> None:
    """Token 32 * w + b is bit b of word w; bit 31 is the int32's sign."""
    mask = torch.tensor([[-(2**31) + 1, 2], [0, -1]], dtype=torch.int32)
    bits = unpack_bits(mask, 40)
    assert bits[0].nonzero().flatten().tolist() == [0, 31, 33]
    assert bits[1].nonzero().flatten().tolist() == list(range(32, 40))
    assert unpack_bits(mask, 32)[0].nonzero().flatten().tolist() == [0, 31]
