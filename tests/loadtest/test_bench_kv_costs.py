"""The KV costs benchmark's pure parts at tiny sizes: its frames read as vLLM 0.32's do, each
section measures what it says (blocks stored, held, matched, learned), the arithmetic of the
workers' share, and the report's tables. Counted, not timed: timed claims come from the
benchmark itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from gateway.kvevents.index import KvIndex
from gateway.kvevents.wire import Removed, Stored, read_frame
from loadtest.bench.kv_costs import chat, cli, events, memory, routing
from loadtest.bench.kv_costs.frames import Chains, frame, removed, stored


def test_frames_read_as_vllm_0_32_sends_them() -> None:
    chain = Chains(1).chain(2, 4)
    message = frame(7, [stored(chain.hashes, 5, chain.tokens, 4), removed(chain.hashes[0])])
    batch = read_frame(message)
    assert batch.seq == 7
    assert batch.events == (
        Stored(tuple(chain.hashes), 5, tuple(chain.tokens), 4),
        Removed((chain.hashes[0],)),
    )
    assert all(0 <= h < 2**64 for h in chain.hashes)
    again = Chains(1).chain(2, 4)  # a second unit caching the same prompt publishes the same
    assert (again.hashes, again.tokens) == (chain.hashes, chain.tokens)


def test_memory_counts_each_holder_of_each_block() -> None:
    rows = {r["holders"]: r for r in memory.by_tracemalloc(300, seed=3)}
    assert [rows["1"]["holdings"], rows["2"]["holdings"]] == [300, 600]
    assert 300 <= rows["1-4"]["holdings"] <= 1200
    assert 0 < rows["1"]["bytes"] < rows["2"]["bytes"]
    assert all(r["blocks"] == 300 for r in rows.values())


def test_stored_frames_chain_as_requests_do_and_removals_empty_the_index() -> None:
    chains = Chains(2)
    index = KvIndex(10_000)
    shape = events.Shape("stored", 3, 2)
    for message in events.stored_frames(chains, shape, 4, batches=40):
        index.apply("u", read_frame(message))
    assert len(index) == 3 * 2 * 40 and index.orphans == 0  # every parent was known
    gone = events.Shape("removed", 5, 1)
    held = len(index)
    for message in events.removed_frames(index, chains, gone, batches=4):
        index.apply("u", read_frame(message))
    assert len(index) == held


def test_events_and_the_workers_share() -> None:
    rows = events.run((16,), tokens=2048, seed=1, steady=500)
    shapes = {(r["kind"], r["shape"]) for r in rows}
    assert shapes == {(s.kind, s.label) for s in (*events.STORED, *events.REMOVED)}
    assert all(r["us_per_block"] > 0 and r["read_us_per_block"] >= 0 for r in rows)
    share = events.worker_share(rows, units=4, loads=[(16, 1000.0)])
    assert [r["regime"] for r in share] == list(events.REGIMES)
    decode = next(r for r in share if r["regime"] == "decode")
    by = {(r["kind"], r["shape"]): r["us_per_block"] for r in rows}
    cycled = by["stored", "8 x 1"] + by["removed", "8 x 1"]
    assert decode["cores_per_worker"] == pytest.approx(4 * 1000 * cycled / 1e6)
    assert decode["tokens_per_s_per_unit"] == 16_000


def test_the_request_path_parts() -> None:
    [row] = routing.depths((4,), (64,), (2,), seed=1, budget_s=0.001)
    assert row["blocks"] == 16 and {"keys_us", "one_of_2_us", "all_2_us"} <= set(row)
    forecast = routing.learned(["a", "b"], 0.05)
    assert all(model.learned for model in forecast.units.values())
    assert [r["units"] for r in routing.estimates((2,), 0.001)] == [2]
    assert [r["learn_every"] for r in routing.learning(0.001)] == [0.0, 0.5]


TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture
def tokenizer(tmp_path: Path) -> Path:
    """A word-level tokenizer with a chat template (SmolLM2's export imports torch: seconds)."""
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "I", "a", "of"]
    vocab = {w: i for i, w in enumerate(["[UNK]", ".", *words, *(f"Ġ{w}" for w in words)])}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return folder


def test_a_whole_run_at_tiny_sizes_writes_its_tables(
    tokenizer: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "QUICK", cli.Sizes(400, 100, 1024, 300, 0.0, 0.001))
    monkeypatch.setattr(chat, "SIZES", (120,))
    monkeypatch.setattr(routing, "PROMPTS", (160,))
    monkeypatch.setattr(routing, "UNITS", (2,))
    argv = ["--out", str(tmp_path), "--quick", "--tokenizer", str(tokenizer)]
    assert cli.main(argv) == 0
    md = (tmp_path / "kv_costs.md").read_text()
    for title in ("1. Index memory", "2. Events", "3a. Prompt ids", "3b.", "3c.", "4. A fleet"):
        assert f"## {title}" in md
    assert (tmp_path / "kv_costs.json").exists()
    [prompt] = json.loads((tmp_path / "kv_costs.json").read_text())["prompts"]
    assert 80 <= prompt["measured_tokens"] <= 160
