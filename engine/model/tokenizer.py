"""Tokenizers with one interface: a byte-level one built from code, and HF `tokenizer.json`.

The engine needs: encode, decode, a chat template returning ids, the stop ids, and streaming
detokenization that never emits half a UTF-8 character (`DetokenizeStream`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from tokenizers import Tokenizer as _HFTokenizer

from gateway.base.chat_template import render, token_text, tokenizer_settings

Message = Mapping[str, Any]
ToolDef = Mapping[str, Any]
ROLES = ("system", "user", "assistant")
TEMPLATE_ROLES = (*ROLES, "tool")  # a template with tool support also renders tool results


class Tokenizer(Protocol):
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    stop_ids: frozenset[int]

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[ToolDef] | None = None,
    ) -> list[int]:
        """`tools` go to a template that renders them (`engine.tools.template_has_tools`);
        other tokenizers see tools through the system prompt and refuse them here."""
        ...


class ByteTokenizer:
    """Ids 0..255 are bytes; then <bos>, <eos>, one marker per role, and <end> (end of turn).

    No training and no files: any text round-trips, which is what a model built from code
    needs. Chat: <bos> (<|role|> content <end>)* [<|assistant|>].
    """

    SPECIALS = ("<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>", "<end>")

    def __init__(self) -> None:
        self.ids = {name: 256 + i for i, name in enumerate(self.SPECIALS)}
        self.vocab_size = 256 + len(self.SPECIALS)
        self.bos_id: int | None = self.ids["<bos>"]
        self.eos_id: int | None = self.ids["<eos>"]
        self.end_id = self.ids["<end>"]
        self.stop_ids = frozenset({self.ids["<eos>"], self.end_id})

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.ids["<bos>"], *ids] if add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Special tokens are dropped; broken UTF-8 becomes U+FFFD rather than an error."""
        try:
            raw = bytes(ids)  # the common case, a few times faster than filtering
        except ValueError:  # a special token (>= 256) among them
            raw = bytes(i for i in ids if 0 <= i < 256)
        return raw.decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[ToolDef] | None = None,
    ) -> list[int]:
        if tools:
            raise ValueError("this tokenizer's chat format has no tools: describe them in text")
        ids = [self.ids["<bos>"]]
        for message in messages:
            role = _role(message)
            ids += [self.ids[f"<|{role}|>"], *self.encode(message["content"]), self.end_id]
        if add_generation_prompt:
            ids.append(self.ids["<|assistant|>"])
        return ids


def _role(message: Message, roles: tuple[str, ...] = ROLES) -> str:
    role = message.get("role", "")
    if role not in roles:
        raise ValueError(f"messages.role: expected one of {roles}, got {role!r}")
    if not isinstance(message.get("content"), str):
        raise ValueError("messages.content: must be a string")
    return str(role)


class TemplatedTokenizer:
    """A `tokenizers.Tokenizer` with its jinja chat template when one is given and renders
    (in a sandbox: the template comes with the model), else a minimal text template
    (`<|role|>\\ncontent\\n`). Where the tokenizer came from (a folder's `tokenizer.json`,
    a GGUF's metadata) is the caller's business."""

    def __init__(
        self,
        tok: _HFTokenizer,
        bos_token: str | None,
        eos_token: str | None,
        template: str | None,
    ) -> None:
        self.tok = tok
        self.vocab_size: int = self.tok.get_vocab_size(with_added_tokens=True)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_id = self._id(self.bos_token)
        self.eos_id = self._id(self.eos_token)
        self.template = template
        stops = {self.eos_id, self._id("<|eot_id|>"), self._id("<|im_end|>")}
        self.stop_ids = frozenset(i for i in stops if i is not None)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.tok.token_to_id(token)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids: list[int] = self.tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tok.decode(list(ids), skip_special_tokens=True)
        return text

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tools: Sequence[ToolDef] | None = None,
    ) -> list[int]:
        tooled = bool(tools) or any(
            m.get("role") == "tool" or m.get("tool_calls") for m in messages
        )
        for message in messages:
            _role(message, TEMPLATE_ROLES if tooled else ROLES)
        rendered = self._render(messages, add_generation_prompt, tools)
        if rendered is not None:
            return self.encode(rendered)
        if tooled:  # the minimal template would drop the calls and results in silence
            raise ValueError("the model's chat template does not render tools or tool calls")
        text = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "<|assistant|>\n"
        return self.encode(text, add_bos=True)

    def _render(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool,
        tools: Sequence[ToolDef] | None = None,
    ) -> str | None:
        """The folder's own template, or None when it has none or it does not render here."""
        if not isinstance(self.template, str):
            return None
        specials = {"bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        try:
            return render(
                self.template,
                messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                specials=specials,
            )
        except Exception:
            return None


class HFTokenizer(TemplatedTokenizer):
    """A Hugging Face folder's `tokenizer.json`, with `tokenizer_config.json`'s special tokens
    and chat template."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        settings = tokenizer_settings(folder)
        template = settings.get("chat_template")
        super().__init__(
            _HFTokenizer.from_file(str(folder / "tokenizer.json")),
            token_text(settings.get("bos_token")),
            token_text(settings.get("eos_token")),
            template if isinstance(template, str) else None,
        )


class DetokenizeStream:
    """Turns generated ids into text deltas without ever emitting half a character.

    Decodes a short window (the ids since the last emitted text plus the previous ones as
    left context, which byte-level BPE and sentencepiece need for spacing) and holds back
    while the window ends in U+FFFD, i.e. an incomplete UTF-8 sequence.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids)
        self.prefix = max(0, len(self.ids) - 5)
        self.read = len(self.ids)

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes (possibly "")."""
        self.ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """At the end of generation: whatever is held back, broken bytes as U+FFFD."""
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]
