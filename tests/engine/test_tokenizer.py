"""Tokenizers: round trips, chat template shape, streaming never splits a character."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.model import ByteTokenizer, DetokenizeStream, HFTokenizer, Tokenizer

TEXT = "héllo wörld, 你好 🙂 — ok"
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi 🙂"}]


def stream(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    detok = DetokenizeStream(tokenizer)
    deltas = [detok.push(i) for i in ids]
    return [*deltas, detok.flush()]


def test_byte_round_trip() -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(TEXT, add_bos=True)) == TEXT
    assert tok.encode("", add_bos=True) == [tok.bos_id]


def test_byte_chat_template_shape() -> None:
    tok = ByteTokenizer()
    ids = tok.apply_chat_template(CHAT)
    system, user, assistant = (tok.ids[f"<|{r}|>"] for r in ("system", "user", "assistant"))
    assert ids[:2] == [tok.bos_id, system]
    assert ids[-1] == assistant
    assert ids.count(tok.end_id) == 2
    assert ids[ids.index(user) + 1 : -2] == tok.encode("hi 🙂")
    assert tok.apply_chat_template(CHAT, add_generation_prompt=False)[-1] == tok.end_id
    assert tok.end_id in tok.stop_ids
    assert tok.decode(ids) == "be briefhi 🙂"


def test_chat_template_rejects_unknown_role() -> None:
    with pytest.raises(ValueError, match="role"):
        ByteTokenizer().apply_chat_template([{"role": "tool", "content": "x"}])


def test_partial_utf8_decodes_with_replacement() -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("🙂")[:2]) == "\ufffd"


def test_incremental_decode_never_emits_broken_utf8() -> None:
    tok = ByteTokenizer()
    ids = [*tok.encode(TEXT), tok.end_id]
    deltas = stream(tok, ids)
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[len(tok.encode("héllo wörld, 你"))] == ""  # mid-character: held back


def test_incremental_flush_reports_truncated_character() -> None:
    tok = ByteTokenizer()
    deltas = stream(tok, [*tok.encode("a"), *tok.encode("🙂")[:3]])
    assert deltas[:-1] == ["a", "", "", ""]
    assert deltas[-1] == "\ufffd"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained here from a few sentences (nothing downloaded)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator([TEXT, "hello world", "the quick brown fox"] * 20, trainer)
    folder = tmp_path_factory.mktemp("tok")
    raw.save(str(folder / "tokenizer.json"))
    settings = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def test_hf_round_trip_and_specials(hf_folder: Path) -> None:
    tok = HFTokenizer(hf_folder)
    ids = tok.encode(TEXT, add_bos=True)
    assert ids[0] == tok.bos_id
    assert tok.decode(ids) == TEXT
    assert tok.eos_id is not None
    assert tok.eos_id in tok.stop_ids


def test_hf_minimal_chat_template(hf_folder: Path) -> None:
    tok = HFTokenizer(hf_folder)
    ids = tok.apply_chat_template(CHAT)
    assert ids[0] == tok.bos_id
    assert tok.decode(ids) == "<|system|>\nbe brief\n<|user|>\nhi 🙂\n<|assistant|>\n"


def test_hf_uses_folder_template(hf_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    tok = HFTokenizer(tmp_path)
    assert tok.decode(tok.apply_chat_template(CHAT)) == "[system] be brief\n[user] hi 🙂\n"


def test_hf_incremental_decode(hf_folder: Path) -> None:
    tok = HFTokenizer(hf_folder)
    text = "hello 🙂 world 你好"
    ids = tok.encode(text)
    deltas = stream(tok, ids)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
