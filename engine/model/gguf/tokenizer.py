"""The tokenizer a GGUF describes, rebuilt with `tokenizers` from its metadata.

A GGUF has no tokenizer.json: it stores the vocabulary (`tokenizer.ggml.tokens`), the merges,
token types, special ids and a pre-tokenizer name (`tokenizer.ggml.pre`), which names one of
llama.cpp's text-splitting rules. Byte-level BPE (`gpt2`) is rebuilt here; the split rule
must be the one the vocabulary was trained with, or ids drift on whitespace and digits.

`smollm` (with starcoder and the others llama.cpp files under the same rule) splits every
digit on its own before GPT-2's regex, exactly what SmolLM2's own tokenizer.json does with
`Digits(individual_digits=True)`. transformers 5.24's GGUF tokenizer has no entry for
`smollm` and uses GPT-2's regex alone, so it differs from the model's tokenizer where a
whitespace run meets a digit ("   42": SmolLM2 and llama.cpp give ĠĠĠ 4 2, transformers
ĠĠ Ġ 4 2); here the model's own rule wins.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from engine.model.gguf.file import GGUFFile
from engine.model.tokenizer import TemplatedTokenizer

# llama.cpp's token types (tokenizer.ggml.token_type)
CONTROL, USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _llama3() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# tokenizer.ggml.pre -> the split rule (the names llama.cpp's converter writes)
PRE_TOKENIZERS: dict[str, Callable[[], pre_tokenizers.PreTokenizer]] = {
    "default": _gpt2,
    "gpt-2": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
    "llama-bpe": _llama3,
    "llama3": _llama3,
}


def gguf_tokenizer(file: GGUFFile) -> TemplatedTokenizer:
    """Encode, decode and the file's own chat template (`tokenizer.chat_template`)."""
    kind = file.string("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"tokenizer.ggml.model: only byte-level BPE ('gpt2') GGUF tokenizers are "
            f"supported, {file.path.name} has {kind!r}"
        )
    pre = file.string("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre: {pre!r} is not one of {sorted(PRE_TOKENIZERS)}")
    tokens = file.strings("tokenizer.ggml.tokens")
    tok = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=_merges(file), fuse_unk=False)
    )
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    _add_specials(tok, tokens, file.get("tokenizer.ggml.token_type") or [])
    template = file.get("tokenizer.chat_template")
    return TemplatedTokenizer(
        tok,
        _token(file, tokens, "tokenizer.ggml.bos_token_id"),
        _token(file, tokens, "tokenizer.ggml.eos_token_id"),
        template if isinstance(template, str) else None,
    )


def _merges(file: GGUFFile) -> list[tuple[str, str]]:
    pairs = []
    for merge in file.strings("tokenizer.ggml.merges"):
        left, sep, right = merge.partition(" ")
        if not sep or not left or not right:
            raise ValueError(f"tokenizer.ggml.merges: {merge!r} is not a pair")
        pairs.append((left, right))
    return pairs


def _add_specials(tok: Tokenizer, tokens: list[str], types: list[int]) -> None:
    """Control tokens (<|im_start|>, ...) stay whole wherever they appear and are dropped on
    decode; user-defined ones stay whole but decode as text, as llama.cpp treats them."""
    special = [t for t, kind in zip(tokens, types, strict=False) if kind == CONTROL]
    user = [t for t, kind in zip(tokens, types, strict=False) if kind == USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])


def _token(file: GGUFFile, tokens: list[str], key: str) -> str | None:
    index = file.get(key)
    if index is None:
        return None
    if not isinstance(index, int) or not 0 <= index < len(tokens):
        raise ValueError(f"{key}: {index!r} is not a token id below {len(tokens)}")
    return tokens[index]
