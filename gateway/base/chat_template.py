"""A model's own chat template rendered as Hugging Face transformers renders it, for vLLM and
the builtin engine alike: the engine renders its prompts with it, and the gateway renders a
request's prompt with it to know which blocks of it a unit has cached. Both read a folder's
tokenizer settings and special tokens here too.

The template comes with the model, so it runs sandboxed (jinja2's immutable sandbox), with
what transformers gives it: `trim_blocks` and `lstrip_blocks`, the loop controls, a `tojson`
that escapes nothing (jinja's own escapes <, > and &, and a model would see other text than
it was trained on), `raise_exception` and `strftime_now`; the special tokens by name
(`bos_token`, `eos_token`, ...) and the caller's other variables. jinja2 is imported on first
use, so this module stays importable without it (the standard-library-only base).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any


class TemplateError(ValueError):
    """The template refused the conversation (its `raise_exception`), or does not compile."""


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"the chat template does not compile: {exc}") from exc


def render(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    specials: Mapping[str, str] | None = None,
    **variables: Any,
) -> str:
    """The conversation as the model reads it. `specials`: the tokenizer's special tokens by
    name (bos_token, eos_token, ...); `variables`: the request's other template variables (a
    server's `chat_template_kwargs`). Raises TemplateError when the template refuses it."""
    import jinja2

    compiled = _compiled(template)
    try:
        text: str = compiled.render(
            **(specials or {}),
            **variables,
            messages=[dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
        )
    except jinja2.TemplateError as exc:
        raise TemplateError(str(exc)) from exc
    return text


def tokenizer_settings(folder: Path) -> dict[str, Any]:
    """A Hugging Face folder's `tokenizer_config.json` ({} without one)."""
    path = folder / "tokenizer_config.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def token_text(value: object) -> str | None:
    """A special token as tokenizer_config keeps it: a string, or {"content": ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None
