"""Which request fields the server honours, accepts without effect, or refuses: the written list.

The rule: a field that would change the answer and that this engine does not honour is refused
with a 400 naming it (`param`), never dropped in silence. A field that cannot change the answer
may be accepted and ignored, but only when listed here. A field listed nowhere is refused as an
unrecognized argument, as OpenAI does: an unknown name may be a feature this engine lacks.

Honoured
- both endpoints: model, stream, stream_options.include_usage, max_tokens,
  max_completion_tokens, temperature, top_p, seed, stop, stop_token_ids, ignore_eos, n,
  return_token_ids, presence_penalty, frequency_penalty, repetition_penalty, logit_bias,
  logprobs, priority, response_format (text, json_object, json_schema with strict),
  structured_outputs (json, json_object, regex, choice, grammar)
- chat: messages, each with role and content; content a string or an array of text parts,
  each exactly {"type": "text", "text": ...}; assistant tool_calls and tool messages
  (tool_call_id); tools, tool_choice, parallel_tool_calls, top_logprobs
- completions: prompt, one string or one array of token ids

Accepted, no effect on the answer
- billing, bookkeeping, caching: user, metadata, store, service_tier, safety_identifier,
  prompt_cache_key, cache_salt, request_id (requests are named by their x-request-id header)
- modifiers of refused features (guided decoding, beam search): guided_decoding_backend,
  guided_whitespace_pattern, length_penalty
- stream_options.include_obfuscation (padding against side channels, not content)

Refused with 400 unless null or a neutral value [in brackets]
- both endpoints: prompt_logprobs, echo [false], use_beam_search [false], top_k [-1, 0],
  min_p [0], min_tokens [0], allowed_token_ids, bad_words [[]], logits_processors,
  truncate_prompt_tokens, include_stop_str_in_output [false], skip_special_tokens [true],
  spaces_between_special_tokens [true] (special tokens are always dropped from the text),
  return_tokens_as_token_ids [false], guided_json, guided_regex, guided_choice,
  guided_grammar (vLLM's older spelling: send structured_outputs), structural_tag,
  stream_options.continuous_usage_stats [false]
- chat: functions [[]], function_call ["none", "auto"] (the legacy spelling: send tools),
  audio, modalities [["text"]], prediction, web_search_options, reasoning_effort, verbosity,
  add_generation_prompt [true], continue_final_message [false], add_special_tokens [false],
  chat_template, chat_template_kwargs [{}], documents
- chat messages (the template sees role, content and tool calls): name, function_call,
  audio, refusal; content parts other than text (image_url, input_audio, file, ...) are
  refused by type in parse.py
- completions: suffix [""], best_of [1], add_special_tokens [true], prompt_embeds
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from engine.server.errors import JSON, bad

REPR_LIMIT = 80  # a refused value is echoed in the message, cut to this many characters


@dataclass(frozen=True, slots=True)
class Policy:
    """What one JSON object (a request body, its stream_options, a chat message) may hold.

    `refused` maps each field to the values still accepted because they ask for nothing this
    engine lacks (null always is); any other value is refused by name.
    """

    where: str
    honoured: frozenset[str]
    ignored: frozenset[str]
    refused: Mapping[str, tuple[object, ...]]

    def known(self, name: str) -> bool:
        return name in self.honoured or name in self.ignored or name in self.refused

    def problem(self, name: str, value: object) -> str | None:
        """Why `name: value` is refused, or None when it is accepted (honoured fields are
        accepted here; their values are checked where they are parsed)."""
        if name in self.honoured or name in self.ignored:
            return None
        if name not in self.refused:
            return f"Unrecognized request argument supplied: '{name}' (in {self.where})"
        neutral = self.refused[name]
        if value is None or any(_same(value, v) for v in neutral):
            return None
        accepted = " or ".join(["null", *(orjson.dumps(v).decode() for v in neutral)])
        got = short(value)
        return f"'{name}' is not supported by this engine (got {got}); it accepts {accepted}"


def check_fields(data: JSON, policy: Policy, parent: str | None = None) -> None:
    """The first refused field, in the order the client sent them, as a 400 naming it."""
    for name, value in data.items():
        problem = policy.problem(name, value)
        if problem is not None:
            raise bad(problem, f"{parent}.{name}" if parent else name)


def _same(value: object, neutral: object) -> bool:
    """Equal and of the same kind: `false` is not the integer 0, nor `true` the number 1."""
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def short(value: object) -> str:
    """A value as a message echoes it: its repr, cut to REPR_LIMIT characters."""
    text = repr(value)
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 4] + " ..."


_HONOURED = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "n",
        "return_token_ids",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "priority",
        "response_format",
        "structured_outputs",
    }
)
_IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "request_id",
        "cache_salt",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "length_penalty",
    }
)
_REFUSED: dict[str, tuple[object, ...]] = {
    "prompt_logprobs": (),
    "echo": (False,),
    "use_beam_search": (False,),
    "top_k": (-1, 0),
    "min_p": (0,),
    "min_tokens": (0,),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "logits_processors": (),
    "truncate_prompt_tokens": (),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "return_tokens_as_token_ids": (False,),
    "guided_json": (),
    "guided_regex": (),
    "guided_choice": (),
    "guided_grammar": (),
    "structural_tag": (),
}
_CHAT_REFUSED: dict[str, tuple[object, ...]] = {
    "functions": ([],),
    "function_call": ("none", "auto"),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "reasoning_effort": (),
    "verbosity": (),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "add_special_tokens": (False,),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "documents": (),
}
_COMPLETION_REFUSED: dict[str, tuple[object, ...]] = {
    "suffix": ("",),
    "best_of": (1,),
    "add_special_tokens": (True,),
    "prompt_embeds": (),
}

_CHAT_HONOURED = _HONOURED | {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "top_logprobs",
}
CHAT = Policy("/v1/chat/completions", _CHAT_HONOURED, _IGNORED, _REFUSED | _CHAT_REFUSED)
COMPLETION = Policy(
    "/v1/completions", _HONOURED | {"prompt"}, _IGNORED, _REFUSED | _COMPLETION_REFUSED
)
STREAM_OPTIONS = Policy(
    "stream_options",
    frozenset({"include_usage"}),
    frozenset({"include_obfuscation"}),
    {"continuous_usage_stats": (False,)},
)
MESSAGE = Policy(
    "a chat message",
    frozenset({"role", "content", "tool_calls", "tool_call_id"}),
    frozenset(),
    {
        "name": (),
        "function_call": (),
        "audio": (),
        "refusal": (),
    },
)
TEXT_PART = Policy("a text part", frozenset({"type", "text"}), frozenset(), {})
