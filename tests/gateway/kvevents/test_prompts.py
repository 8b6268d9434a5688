"""A request's prompt ids as vLLM computes them: the gateway's rendering and tokenizing against
transformers' `apply_chat_template` (what vLLM calls), over generated conversations, on the
packaged SmolLM2's tokenizer files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.kvevents.keys import block_keys
from gateway.kvevents.prompts import PromptTokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.model.export import export_tokenizer
    from engine.model.gguf import GGUFFile, gguf_path

    out = tmp_path_factory.mktemp("smollm2-tokenizer")
    export_tokenizer(GGUFFile(gguf_path("smollm2")), out)
    return out


@pytest.fixture(scope="module")
def reference(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def ours(folder: Path) -> PromptTokens:
    return PromptTokens(folder)


def expected(reference: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    ids = reference.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    return list(ids)


TEXT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=80
) | st.sampled_from(["", " ", "\n\n", "<|im_start|>", "{{ x }}", "héllo wörld", "🙂 ok"])
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": TEXT}
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(MESSAGE, min_size=1, max_size=6))
def test_a_conversations_ids_are_what_transformers_gives(
    ours: PromptTokens, reference: Any, messages: list[dict[str, Any]]
) -> None:
    assert list(ours.chat(messages) or [None]) == expected(reference, messages)


def test_text_parts_are_joined_with_newlines_as_vllm_does(
    ours: PromptTokens, reference: Any
) -> None:
    parts = [{"type": "text", "text": "Find a red"}, {"type": "text", "text": "jacket."}]
    joined = [{"role": "user", "content": "Find a red\njacket."}]
    assert list(ours.chat([{"role": "user", "content": parts}]) or [None]) == expected(
        reference, joined
    )


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": 3},
        "not a message",
    ],
)
def test_what_is_not_plain_text_gives_no_ids(ours: PromptTokens, message: Any) -> None:
    assert ours.chat([message]) is None


def test_a_completions_prompt_is_tokenized_with_its_special_tokens(
    ours: PromptTokens, reference: Any
) -> None:
    prompt = "The capital of France is"
    assert list(ours.completion(prompt)) == reference(prompt, add_special_tokens=True)["input_ids"]


def test_two_requests_sharing_a_system_prompt_share_its_leading_blocks(
    ours: PromptTokens,
) -> None:
    system = {"role": "system", "content": "You are a shopping assistant. " * 40}
    a = ours.chat([system, {"role": "user", "content": "a red jacket"}])
    b = ours.chat([system, {"role": "user", "content": "blue shoes, size 42"}])
    assert a is not None and b is not None
    ka, kb = block_keys(a, 16), block_keys(b, 16)
    shared = next(i for i, (x, y) in enumerate(zip(ka, kb, strict=False)) if x != y)
    assert shared >= 15  # about 250 tokens of system prompt: 15 full blocks of 16


def test_the_pieces_between_added_tokens_are_kept_and_agree(ours: PromptTokens) -> None:
    """The ids above come through the pieces' cache (SmolLM2's added tokens strip nothing):
    a shared system prompt is tokenized once, and the cache stays bounded."""
    assert ours._split is not None
    system = {"role": "system", "content": "Shop assistant. " * 50}
    ours.chat([system, {"role": "user", "content": "one"}])
    kept = len(ours._pieces)
    ours.chat([system, {"role": "user", "content": "two"}])
    assert len(ours._pieces) == kept + 1  # only the new user message was read


def test_prompts_by_model_and_request_shape(folder: Path) -> None:
    from gateway.kvevents.prompts import Prompts

    prompts = Prompts({"m": str(folder)})
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    assert prompts.ids("other", True, chat) is None
    ids = prompts.ids("m", True, chat)
    assert ids is not None and len(ids) > 3
    assert list(prompts.ids("m", False, {"prompt": [5, 6, 7]}) or []) == [5, 6, 7]
    assert prompts.ids("m", False, {"prompt": [5, -1]}) is None
    assert prompts.ids("m", False, {"prompt": ["a", "b"]}) is None
    assert prompts.ids("m", True, {**chat, "continue_final_message": True}) is None
    assert prompts.ids("m", True, {**chat, "chat_template_kwargs": "x"}) is None
