"""A request's prompt as the token ids a vLLM unit computes it into, so that the gateway can key
its blocks (keys.py) and ask the index which units hold them.

A model's Hugging Face folder gives what vLLM uses: `tokenizer.json` (the `tokenizers`
library, vLLM's fast tokenizer) and the chat template (`chat_template.jinja`, else
`tokenizer_config.json`'s), rendered as transformers renders it (gateway/base/chat_template.py).
vLLM tokenizes a chat's rendered text without adding special tokens (the template wrote
them) and a completion's prompt with them.

Exact for what vLLM renders the same way: messages whose content is text (a string, or text
parts, which vLLM joins with newlines). Anything else (images, tool calls in the history, the
`developer` role a template may not know) gives None: the request is routed as before, by
the approximate prefix hash. A wrong guess costs only a cache hit, never an answer.
"""

from __future__ import annotations

import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from gateway.base.chat_template import TemplateError, render, token_text, tokenizer_settings

# transformers' special tokens, passed to a template by name
SPECIALS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
ROLES = frozenset({"system", "user", "assistant", "tool"})
PIECES = 8192  # texts between added tokens whose ids are kept (least recently used out)
PIECE_TOKENS = 2_000_000  # and their ids at most, in all (4 bytes each, their text beside)


class PromptTokens:
    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        settings = tokenizer_settings(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.template = _template(folder, settings)
        self.specials = {
            name: text for name in SPECIALS if (text := token_text(settings.get(name))) is not None
        }
        self._pieces: OrderedDict[str, array[int]] = OrderedDict()
        self._piece_tokens = 0
        self._split = _splitter(self.tokenizer, folder / "tokenizer.json")
        if self._split is not None and not self._pieces_agree():
            self._split = None

    def chat(
        self,
        messages: Sequence[Any],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        variables: Mapping[str, Any] | None = None,
    ) -> array[int] | None:
        """The chat's prompt ids, or None where they cannot be known exactly."""
        if self.template is None:
            return None
        plain = [_plain(m) for m in messages]
        if any(m is None for m in plain):
            return None
        try:
            text = render(
                self.template,
                plain,  # type: ignore[arg-type]
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                specials=self.specials,
                **(variables or {}),
            )
        except (TemplateError, TypeError):
            return None
        return self.encode(text)

    def encode(self, text: str) -> array[int]:
        """`text`'s ids without added special tokens, as the tokenizer gives them. The
        tokenizer splits a text at its added tokens (`<|im_start|>`, ...) before anything
        else and reads each piece alone, so the pieces' ids are kept: a system prompt or an
        earlier turn that requests share is tokenized once (about 2 us a token here)."""
        split = self._split
        if split is None:
            return array("i", self.tokenizer.encode(text, add_special_tokens=False).ids)
        out = array("i")
        pieces = self._pieces
        for piece in split(text):
            if not piece:
                continue
            known = pieces.get(piece)
            if known is None:
                known = array("i", self.tokenizer.encode(piece, add_special_tokens=False).ids)
                pieces[piece] = known
                self._piece_tokens += len(known)
                while len(pieces) > PIECES or self._piece_tokens > PIECE_TOKENS:
                    _, old = pieces.popitem(last=False)
                    self._piece_tokens -= len(old)
            else:
                pieces.move_to_end(piece)
            out += known
        return out

    def _pieces_agree(self) -> bool:
        """The pieces' ids joined are the whole text's, on a conversation the template renders
        (a tokenizer whose pre-tokenizer marks the text's start would differ)."""
        if self.template is None:
            return False
        sample = [
            {"role": "system", "content": " Be brief.\n\n"},
            {"role": "user", "content": "Hello there, 123 ünïcode  spaces\t"},
            {"role": "assistant", "content": "\nHi!"},
            {"role": "user", "content": "Again?"},
        ]
        try:
            text = render(self.template, sample, specials=self.specials)
        except (TemplateError, TypeError):
            return False
        whole = array("i", self.tokenizer.encode(text, add_special_tokens=False).ids)
        self._pieces.clear()
        self._piece_tokens = 0
        return self.encode(text) == whole

    def completion(self, prompt: str) -> array[int]:
        return array("i", self.tokenizer.encode(prompt, add_special_tokens=True).ids)


def _splitter(tokenizer: Tokenizer, file: Path) -> Callable[[str], list[str]] | None:
    """A split of a text at the tokenizer's added tokens, keeping them; None where the pieces
    would not be read as the tokenizer reads them: an added token that strips the spaces
    beside it or matches normalized text, or a pre-tokenizer that marks where the text starts
    (Metaspace: the pieces would each be a start)."""
    added = tokenizer.get_added_tokens_decoder().values()
    if not added or any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added):
        return None
    if '"Metaspace"' in file.read_text():
        return None
    contents = sorted((t.content for t in added), key=len, reverse=True)  # longest first
    pattern = re.compile("(" + "|".join(re.escape(c) for c in contents) + ")")
    return pattern.split


def _plain(message: Any) -> dict[str, Any] | None:
    """A message as vLLM hands it to the template when its content is text, else None."""
    if not isinstance(message, Mapping) or message.get("role") not in ROLES:
        return None
    if message.get("tool_calls") or set(message) - {"role", "content", "name"}:
        return None
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, Mapping) and p.get("type") == "text" for p in content):
            return None
        texts = [p.get("text") for p in content]
        if not all(isinstance(t, str) for t in texts):
            return None
        content = "\n".join(texts)
    if not isinstance(content, str):
        return None
    plain = {"role": message["role"], "content": content}
    if "name" in message:
        plain["name"] = message["name"]
    return plain


def _template(folder: Path, settings: Mapping[str, Any]) -> str | None:
    own = folder / "chat_template.jinja"
    if own.exists():
        return own.read_text()
    template = settings.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class Prompts:
    """Each model's PromptTokens (`[routing] tokenizers`), asked for a request's prompt ids."""

    def __init__(self, folders: Mapping[str, str]) -> None:
        self._models = {model: PromptTokens(folder) for model, folder in folders.items()}

    def vocabulary(self, model: str) -> int | None:
        """How many token ids `model`'s tokenizer has, added tokens included (None: no
        tokenizer for it): a unit's events naming an id past it are another model's."""
        tokens = self._models.get(model)
        return None if tokens is None else tokens.tokenizer.get_vocab_size(with_added_tokens=True)

    def ids(self, model: str, chat: bool, data: Mapping[str, Any]) -> array[int] | None:
        """A chat's or a completion's prompt ids (None: not known exactly here)."""
        tokens = self._models.get(model)
        if tokens is None:
            return None
        if chat:
            messages = data.get("messages")
            tools = data.get("tools")
            variables = data.get("chat_template_kwargs")
            if not isinstance(messages, list) or not isinstance(variables, dict | None):
                return None
            if tools is not None and not _are_tools(tools):
                return None
            add = data.get("add_generation_prompt", True) is not False
            if data.get("continue_final_message"):
                return None
            return tokens.chat(messages, tools, add, variables)
        prompt = data.get("prompt")
        if isinstance(prompt, str):
            return tokens.completion(prompt)
        if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
            try:
                return array("i", prompt)  # the client's own token ids
            except OverflowError:
                return None
        return None


def _are_tools(tools: object) -> bool:
    return isinstance(tools, list) and all(isinstance(t, Mapping) for t in tools)


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
