"""OpenAI request bodies -> prompt ids and SamplingParams, or a 400 naming the parameter.

The gateway validates too, but the leader is also reached directly (load tools, tests, another
gateway version), so it checks everything it relies on. Which fields are honoured, accepted
without effect or refused is decided in `fields.py`; nothing is dropped in silence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from engine.api import Engine
from engine.grammar import GrammarError, lark_grammar
from engine.model.tokenizer import Tokenizer
from engine.scheduler import InvalidParams, SamplingParams
from engine.server.errors import JSON, ApiError, bad
from engine.server.fields import (
    CHAT,
    COMPLETION,
    MESSAGE,
    STREAM_OPTIONS,
    TEXT_PART,
    check_fields,
)
from engine.server.sampling_fields import (
    chat_logprobs,
    choices,
    completion_logprobs,
    logit_bias,
    penalties,
    priority,
    seed,
    typed,
)
from engine.server.structured import response_format_grammar, structured_outputs_grammar
from engine.tools import (
    ToolError,
    ToolSpec,
    parse_tools,
    prompt_messages,
    template_has_tools,
    tool_grammar,
)

Kind = Literal["chat", "completion"]

CHAT_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy default; chat defaults to the rest of context


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """`logprobs`: None, or how many alternatives each token's logprob entry lists.
    `tools`: the request's tools when the answer is parsed for calls (not with "none")."""

    kind: Kind
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    n: int = 1
    grammar: str | None = None
    logprobs: int | None = None
    tools: ToolSpec | None = None

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


def parse_request(kind: Kind, raw: bytes, engine: Engine) -> ParsedRequest:
    data = _load(raw)
    _check_model(data, engine.model_name)
    check_fields(data, CHAT if kind == "chat" else COMPLETION)
    tokenizer = engine.tokenizer
    tools = _tools(data) if kind == "chat" else None
    if kind == "chat":
        ids = _chat_prompt(data, tokenizer, tools)
    else:
        ids = _completion_prompt(data, tokenizer)
    grammar = _grammar(data, tools, engine)
    _check_length(ids, engine.max_seq_len, "messages" if kind == "chat" else "prompt")
    room = engine.max_seq_len - len(ids)
    default_max = room if kind == "chat" else min(room, COMPLETION_DEFAULT_MAX_TOKENS)
    options = typed(data, "stream_options", dict, "an object") or {}
    check_fields(options, STREAM_OPTIONS, "stream_options")
    logprobs = chat_logprobs(data) if kind == "chat" else completion_logprobs(data)
    return ParsedRequest(
        kind=kind,
        prompt_ids=tuple(ids),
        params=_sampling(data, default_max, logprobs, tokenizer.vocab_size),
        stream=bool(typed(data, "stream", bool, "a boolean")),
        include_usage=bool(typed(options, "include_usage", bool, "a boolean", "stream_options")),
        return_token_ids=bool(typed(data, "return_token_ids", bool, "a boolean")),
        n=choices(data),
        grammar=grammar,
        logprobs=logprobs,
        tools=tools,
    )


def _tools(data: JSON) -> ToolSpec | None:
    try:
        return parse_tools(data)
    except ToolError as exc:
        raise bad(exc.message, exc.param) from None


def _grammar(data: JSON, tools: ToolSpec | None, engine: Engine) -> str | None:
    """The answer's grammar, checked against the engine's tokenizer, or None."""
    constraint = _constraint(data, tools)
    if constraint is None:
        return None
    param, grammar = constraint
    try:
        engine.check_grammar(grammar)
    except GrammarError as exc:
        raise bad(f"'{param}' cannot be used for constrained decoding: {exc}", param) from None
    return grammar


def _constraint(data: JSON, tools: ToolSpec | None) -> tuple[str, str] | None:
    """(the field asking, its grammar): at most one of a response format, vLLM's
    structured_outputs, or tools (every tool_choice but "none" has a grammar)."""
    asked = {
        "response_format": response_format_grammar(data.get("response_format")),
        "structured_outputs": structured_outputs_grammar(data.get("structured_outputs")),
        "tools": _tool_grammar(tools),
    }
    given = [(name, g) for name, g in asked.items() if g is not None]
    if len(given) > 1:
        names = " and ".join(f"'{name}'" for name, _ in given)
        raise bad(f"{names} both constrain the answer; send one of them", given[1][0])
    return given[0] if given else None


def _load(raw: bytes) -> JSON:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad(f"request body is not valid JSON: {exc}", None) from None
    if not isinstance(data, dict):
        raise bad("request body must be a JSON object", None)
    return data


def _check_model(data: JSON, served: str) -> None:
    model = typed(data, "model", str, "a string")
    if model is None:
        raise bad("missing required parameter 'model'", "model")
    if model != served:
        message = f"The model '{model}' does not exist; this unit serves '{served}'"
        raise ApiError(404, message, param="model", code="model_not_found")


def _tool_grammar(tools: ToolSpec | None) -> str | None:
    try:
        lark = None if tools is None else tool_grammar(tools)
        return None if lark is None else lark_grammar(lark)
    except GrammarError as exc:
        message = f"'tools' cannot be used for constrained decoding: {exc}"
        raise bad(message, "tools") from None


def _chat_prompt(data: JSON, tokenizer: Tokenizer, tools: ToolSpec | None) -> list[int]:
    """The conversation through the model's chat template; tools, calls and results in the
    template's own format when it has one, else in the system-prompt format (engine/tools)."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' is required and must be a non-empty array", "messages")
    conversation = [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    native = template_has_tools(getattr(tokenizer, "template", None))
    try:
        prompt = prompt_messages(conversation, tools, native)
    except ToolError as exc:
        raise bad(exc.message, exc.param) from None
    try:
        return tokenizer.apply_chat_template(prompt.messages, tools=prompt.tools)
    except ValueError as exc:
        raise bad(f"'messages' cannot be rendered: {exc}", "messages") from None


def _message(message: Any, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise bad(f"'{where}' must be an object", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in CHAT_ROLES:
        param = f"{where}.role"
        raise bad(f"'{param}' must be one of {sorted(CHAT_ROLES)}, got {role!r}", param)
    check_fields(message, MESSAGE, where)
    out: dict[str, Any] = {"role": CHAT_ROLES[role]}
    content = message.get("content")
    calls = message.get("tool_calls")
    if content is None and role == "assistant" and calls:
        out["content"] = None  # a turn of calls only
    else:
        out["content"] = _content(content, where)
    if calls is not None:
        out["tool_calls"] = calls
    if "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _content(content: Any, where: str) -> str:
    """A string, or text parts joined by newlines (as vLLM does). Other parts are refused by
    type: an image or a sound the model never sees would change the answer."""
    param = f"{where}.content"
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{param}' must be a string or an array of text parts", param)
    return "\n".join(_text(part, f"{param}[{i}]", param) for i, part in enumerate(content))


def _text(part: Any, where: str, param: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind != "text":
        what = f"a part of type {kind!r}" if isinstance(kind, str) else "not a text part"
        raise bad(f"'{where}' is {what}; this engine reads text parts only", param)
    check_fields(part, TEXT_PART, where)
    text = part.get("text")
    if not isinstance(text, str):
        raise bad(f"'{where}.text' must be a string", param)
    return text


def _completion_prompt(data: JSON, tokenizer: Tokenizer) -> list[int]:
    """A string (encoded with BOS, like vLLM) or token ids used as-is for exact resumption."""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        if len(prompt) > 1:
            message = "batched prompts are not supported: send one prompt per request"
            raise bad(message, "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, add_bos=True)
    elif isinstance(prompt, list):
        # Bounded by the engine, which knows the model's vocabulary: a model may emit ids past
        # the tokenizer's (padded embeddings), and a resumed stream sends them back as prompt.
        ids = _token_ids(prompt, 2**63, "prompt")
    else:
        raise bad("'prompt' is required: a string or an array of token ids", "prompt")
    if not ids:
        raise bad("'prompt' must not be empty", "prompt")
    return ids


def _token_ids(value: list[Any], vocab_size: int, param: str) -> list[int]:
    for token in value:
        if not isinstance(token, int) or isinstance(token, bool):
            raise bad(f"'{param}' must contain only integer token ids, got {token!r}", param)
        if not 0 <= token < vocab_size:
            raise bad(f"'{param}': token id {token} is outside [0, {vocab_size})", param)
    return list(value)


def _check_length(ids: list[int], max_seq_len: int, param: str) -> None:
    if len(ids) >= max_seq_len:
        message = (
            f"This model's maximum context length is {max_seq_len} tokens; the prompt has "
            f"{len(ids)} tokens, leaving no room for a completion"
        )
        raise bad(message, param, "context_length_exceeded")


def _sampling(
    data: JSON, default_max: int, logprobs: int | None, vocab_size: int
) -> SamplingParams:
    fields: JSON = {
        "max_tokens": _max_tokens(data, default_max),
        "temperature": _number(data, "temperature", 0.0, 2.0),
        "top_p": _number(data, "top_p", 0.0, 1.0),
        "seed": seed(data),
        "stop": _stop(data),
        "stop_token_ids": _stop_token_ids(data),
        "ignore_eos": typed(data, "ignore_eos", bool, "a boolean"),
        "logit_bias": logit_bias(data, vocab_size),
        "logprobs": logprobs,
        "priority": priority(data),
        **penalties(data),
    }
    try:
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except InvalidParams as exc:
        raise bad(f"'{exc.field}' {exc.problem}, got {exc.value!r}", exc.field) from None


def _max_tokens(data: JSON, default: int) -> int:
    """max_completion_tokens (the current name) wins over max_tokens (the deprecated one)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = typed(data, name, int, "an integer")
        if value is not None:
            if value < 1:
                raise bad(f"'{name}' must be >= 1, got {value}", name)
            return int(value)
    return default


def _number(data: JSON, name: str, low: float, high: float) -> float | None:
    value = data.get(name)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise bad(f"'{name}' must be a number in [{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _stop(data: JSON) -> tuple[str, ...] | None:
    stop = data.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad("'stop' must be a non-empty string or an array of non-empty strings", "stop")
    return tuple(stop)


def _stop_token_ids(data: JSON) -> tuple[int, ...] | None:
    value = typed(data, "stop_token_ids", list, "an array of token ids")
    return None if value is None else tuple(_token_ids(value, 2**63, "stop_token_ids"))
