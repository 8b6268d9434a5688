"""The results as Markdown tables (printed, and kv_costs.md) and as kv_costs.json."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

CLAIMED_BYTES_PER_BLOCK = 400  # what `kv_index_blocks`'s docs said a block one unit holds
Rows = Sequence[dict[str, Any]]


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def memory(rows: Rows) -> list[str]:
    body = [
        (
            r["method"],
            _n(r["blocks"]),
            r["holders"],
            _n(r["bytes"] / 2**20, 1),
            _n(r["bytes_per_block"]),
            _n(r["bytes_per_holding"]),
        )
        for r in rows
    ]
    head = (
        "measure",
        "blocks",
        "units holding each",
        "MiB",
        "bytes a block",
        "bytes a (block, unit)",
    )
    lines = _table(head, body)
    for method in sorted({r["method"] for r in rows}):
        by = {r["holders"]: r for r in rows if r["method"] == method}
        if "1" in by and "2" in by:
            second = by["2"]["bytes_per_block"] - by["1"]["bytes_per_block"]
            lines.append(
                f"\n{method}: a block one unit holds {_n(by['1']['bytes_per_block'])} bytes, a"
                f" second unit holding it {_n(second)} more (the docs said about"
                f" {CLAIMED_BYTES_PER_BLOCK})."
            )
    return lines


def events(rows: Rows) -> list[str]:
    body = [
        (
            r["kind"],
            r["shape"],
            r["block_size"] or "-",
            _n(r["batches_per_s"]),
            _n(r["blocks_per_s"]),
            _n(r["read_us_per_block"], 1),
            _n(r["apply_us_per_block"], 1),
            _n(r["us_per_block"], 1),
        )
        for r in rows
    ]
    head = (
        "event", "batch (events x blocks)", "block size", "batches/s", "blocks/s",
        "read us/block", "apply us/block", "CPU us/block",
    )  # fmt: skip
    return _table(head, body)


def workers(rows: Rows, counts: Sequence[int]) -> list[str]:
    body = [
        (
            r["block_size"],
            r["regime"],
            _fleet(r),
            _n(r["us_per_block"], 1),
            f"{r['cores_per_worker']:.0%}",
            f"{r['read_cores_per_worker']:.0%}",
            f"{r['apply_cores_per_worker']:.0%}",
            *(f"{n * r['cores_per_worker']:.2f}" for n in counts),
        )
        for r in rows
    ]
    head = (
        "block size", "blocks from", "units x blocks/s each", "CPU us a block stored + evicted",
        "one worker's core", "of it: read", "of it: apply",
        *(f"cores, {n} workers" for n in counts),
    )  # fmt: skip
    return _table(head, body)


def _fleet(row: dict[str, Any]) -> str:
    per_unit, tokens = _n(row["blocks_per_s_per_unit"]), _n(row["tokens_per_s_per_unit"])
    return f"{row['units']} x {per_unit} ({tokens} tokens/s)"


def prompts(rows: Rows) -> list[str]:
    body = [
        (
            _n(r["measured_tokens"]),
            _n(r["first_us"]),
            _n(r["first_us_per_token"], 2),
            _n(r["repeated_us"]),
        )
        for r in rows
    ]
    head = ("prompt tokens", "first system prompt, us", "us a token", "repeated system prompt, us")
    return _table(head, body)


def depths(rows: Rows) -> list[str]:
    keys = [k for k in rows[0] if k.endswith("_us") and k != "keys_us"] if rows else []
    head = ("block size", "prompt tokens", "blocks", "block_keys us", *(_label(k) for k in keys))
    body = [
        (r["block_size"], _n(r["prompt_tokens"]), r["blocks"], _n(r["keys_us"]), *_cells(r, keys))
        for r in rows
    ]
    return _table(head, body)


def _cells(row: dict[str, Any], keys: Sequence[str]) -> list[str]:
    return [_n(row[k]) for k in keys]


def _label(key: str) -> str:
    """`all_8_us` -> "depths, all 8 hold it, us"; `one_of_32_us` -> "depths, 1 of 32 ..."."""
    words = key.removesuffix("_us").split("_")
    holders = f"all {words[1]}" if words[0] == "all" else f"1 of {words[2]}"
    return f"depths, {holders} hold it, us"


def forecast(estimates: Rows, learning: Rows) -> list[str]:
    lines = _table(
        ("candidates", "Forecast.estimates us"),
        [(r["units"], _n(r["estimates_us"], 1)) for r in estimates],
    )
    lines.append("")
    body = [
        (
            f"{r['learn_every']:g} s",
            _n(r["requests_per_s_per_unit"]),
            _n(r["us_per_request"], 1),
        )
        for r in learning
    ]
    head = ("learn_every", "requests/s to the unit", "Placed + sent + first_token + finished, us")
    return lines + _table(head, body)


def markdown(report: dict[str, Any]) -> str:
    sections = [
        ("1. Index memory", memory(report["memory"])),
        ("2. Events one process reads and applies", events(report["events"])),
        ("3a. Prompt ids (Prompts.ids, SmolLM2)", prompts(report["prompts"])),
        ("3b. Cache lookup (KvFleet.depths)", depths(report["depths"])),
        ("3c. Latency model", forecast(report["estimates"], report["learning"])),
        (
            "4. A fleet's events, per worker process",
            workers(report["workers"], report["worker_counts"]),
        ),
    ]
    return "\n\n".join(f"## {title}\n\n" + "\n".join(lines) for title, lines in sections) + "\n"


def write(out: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "kv_costs.json", out / "kv_costs.md"
    json_path.write_bytes(
        orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    )
    md_path.write_text(markdown(report))
    return json_path, md_path
