"""What the report says about the run beside its rows: the fleet's cache, the settings, each
pressure's working set, the versions, and the notes the markdown table carries."""

from __future__ import annotations

import argparse
import time
from typing import Any

from loadtest.bench.overhead import peers
from loadtest.bench.prefix.pressure import NULL_BLOCKS, Kv


def info(
    args: argparse.Namespace, facts: dict[str, object], kv: Kv, found: dict[str, Any], took: float
) -> dict[str, Any]:
    blocks, block_size = found["reported_blocks"], found["block_size"]
    fleet = {"servers": args.servers, "kv_bytes_per_server": kv.bytes}
    fleet |= {"kv_bytes_per_token": kv.per_token, "computed_blocks": kv.blocks}
    fleet |= {"reported_blocks": blocks, "block_size": block_size, "vllm": found["vllm"]}
    settings = {k: getattr(args, k) for k in ("prefix_words", "rounds", "concurrency", "seed")}
    settings |= {"max_tokens": args.max_tokens, "modes": args.modes}
    pressures = [
        {"target": p.pressure.target, "groups": p.pressure.groups,
         "working_set_blocks": p.pressure.working_set_blocks,
         "share_of_fleet": p.pressure.share_of_fleet, "share_of_server": p.pressure.share_of_server,
         "hit_ceiling": p.ceiling, "requests": len(p.prompt_tokens),
         "prompt_tokens_mean": sum(p.prompt_tokens) / len(p.prompt_tokens)}
        for p in found["plans"]
    ]  # fmt: skip
    versions = {"vllm": found["vllm"], "vllm-router": peers.versions()["vllm-router"]}
    return {
        "machine": facts | {"minutes": took / 60},
        "fleet": fleet,
        "settings": settings,
        "versions": versions,
        "pressures": pressures,
        "notes": notes(args, kv, fleet, pressures),
    }


def notes(
    args: argparse.Namespace, kv: Kv, fleet: dict[str, Any], pressures: list[dict[str, Any]]
) -> list[str]:
    blocks, size = fleet["reported_blocks"], fleet["block_size"]
    sets = "; ".join(
        f"{p['share_of_fleet']:.0%}: {p['groups']} groups, {p['working_set_blocks']} blocks,"
        f" prompts of {p['prompt_tokens_mean']:.0f} tokens on average"
        for p in pressures
    )
    return [
        f"{time.strftime('%Y-%m-%d')}: {args.servers} stock vLLM {fleet['vllm']} servers"
        f" (SmolLM2-135M, float32: {kv.per_token:,} B of KV a token), {kv.mib} MiB of KV"
        f" cache each = {blocks} blocks of {size} tokens ({blocks - NULL_BLOCKS} usable).",
        f"Working sets (shared prefix blocks over the fleet's usable blocks): {sets}. Each"
        f" group's requests come {args.rounds} times, once a round; {args.max_tokens} output"
        f" tokens a request (ignore_eos), {args.concurrency} requests at a time, seed {args.seed}.",
        "Every mode gets the same requests in the same order from empty caches (vLLM's"
        " POST /reset_prefix_cache, dev mode, before each mode).",
        "load = the gateway with affinity none and prefix_scorer off: power of two choices by"
        " requests in flight (with two units, the less loaded one), not a strict round robin."
        " approximate = prefix_scorer approximate (the first prefix_chars of the prompt)."
        " vllm-router = its cache_aware policy at its defaults. precise = prefix_scorer auto"
        " with every unit's KV events and the model's tokenizer, the latency model observing."
        " predicted = the same with the latency model routing (latency_model route): to the unit"
        " predicted to answer soonest once each unit has 20 answers. The other gateway modes"
        " run with it off.",
        "Fleet hit rate = all servers' vllm:prefix_cache_hits_total over"
        " vllm:prefix_cache_queries_total (prompt tokens) during the mode; in brackets the"
        " ceiling, where only each group's first request misses. Busiest unit = the largest"
        " share of prompt tokens one server was asked for (50% = even over two).",
    ]
