"""A mode's measurements as a row; the rows as a printed table, markdown and JSON."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadtest.bench.prefix import scrape
from loadtest.bench.prefix.load import Phase
from loadtest.bench.prefix.pressure import Pressure
from loadtest.gen.stats import percentile

COLUMNS = (
    "working set", "mode", "TTFT p50 s", "p90 s", "p99 s", "output tok/s", "fleet hit rate",
    "busiest unit", "failed",
)  # fmt: skip
KV_COLUMNS = (
    "working set", "mode", "index blocks", "event batches", "replays", "drops", "bad frames",
    "orphans", "trusted units", "cached tokens predicted within 5%",
)  # fmt: skip
KV_KEYS = ("index_blocks", "batches", "replays", "drops", "bad_frames", "orphans", "trusted_units")


@dataclass(frozen=True)
class Result:
    """One mode at one pressure: the load's answers, each server's prefix cache counters over
    the mode's window, and (the modes reading events) the gateway's KV figures over it."""

    pressure: Pressure
    ceiling: float  # the best hit rate the requests allow (pressure.hit_ceiling)
    mode: str
    phase: Phase
    caches: Mapping[str, scrape.Cache]
    kv: Mapping[str, float] | None = None


def _pct(ordered: Sequence[float], q: float) -> float:
    """loadtest.gen's nearest rank: a reported percentile is a latency some request saw."""
    return percentile(ordered, q) if ordered else math.nan


def row(result: Result) -> dict[str, Any]:
    p, phase = result.pressure, result.phase
    ttfts = phase.ttfts_s
    return {
        "target": p.target,
        "working_set_share": p.share_of_fleet,
        "groups": p.groups,
        "mode": result.mode,
        "requests": len(phase.answers),
        "failures": phase.failures,
        "wall_s": phase.wall_s,
        "ttft_p50_s": _pct(ttfts, 50),
        "ttft_p90_s": _pct(ttfts, 90),
        "ttft_p99_s": _pct(ttfts, 99),
        "output_tokens_per_s": phase.tokens_per_s,
        "hit_rate": scrape.hit_rate(result.caches),
        "hit_ceiling": result.ceiling,
        "busiest_share": scrape.busiest_share(result.caches),
        "servers": {
            url: {"hits": c.hits, "queries": c.queries} for url, c in result.caches.items()
        },
        "kv": dict(result.kv) if result.kv is not None else None,
        # each request's, in the order sent (None: no token came)
        "ttfts_s": [a.ttft_s for a in phase.answers],
    }


def _working_set(r: Mapping[str, Any]) -> str:
    return f"{r['working_set_share']:.0%} ({r['groups']} groups)"


def cells(r: Mapping[str, Any]) -> list[str]:
    return [
        _working_set(r), r["mode"], f"{r['ttft_p50_s']:.2f}", f"{r['ttft_p90_s']:.2f}",
        f"{r['ttft_p99_s']:.2f}", f"{r['output_tokens_per_s']:.1f}",
        f"{r['hit_rate']:.0%} (of {r['hit_ceiling']:.0%})", f"{r['busiest_share']:.0%}",
        f"{r['failures']}/{r['requests']}",
    ]  # fmt: skip


def kv_cells(r: Mapping[str, Any]) -> list[str]:
    kv = r["kv"]
    return [_working_set(r), r["mode"], *(f"{kv[key]:g}" for key in KV_KEYS), _predicted(kv)]


def _predicted(kv: Mapping[str, float]) -> str:
    """The share of requests whose cached tokens the gateway predicted within 5% of the
    server's count, of those the server counted."""
    counted = sum(kv.get(f"predicted_{o}", 0.0) for o in scrape.OUTCOMES)
    if not counted:
        return "-"
    return f"{kv.get('predicted_exact', 0.0) / counted:.0%} of {counted:g}"


def markdown(rows: Sequence[Mapping[str, Any]], notes: Sequence[str]) -> str:
    """The results table; beneath it the KV figures of the gateways reading events; then the
    notes."""
    lines = _md_table(COLUMNS, [cells(r) for r in rows])
    kv_rows = [kv_cells(r) for r in rows if r["kv"] is not None]
    if kv_rows:
        lines += ["", "The KV index and events of the gateways reading them, over each window:", ""]
        lines += _md_table(KV_COLUMNS, kv_rows)
    lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def _md_table(columns: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    head = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return head + ["| " + " | ".join(line) + " |" for line in body]


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    _print_aligned(COLUMNS, [cells(r) for r in rows])
    kv_rows = [kv_cells(r) for r in rows if r["kv"] is not None]
    if kv_rows:
        print("\nthe KV index and events of the gateways reading them, over each window:")
        _print_aligned(KV_COLUMNS, kv_rows)


def _print_aligned(columns: Sequence[str], body: Sequence[Sequence[str]]) -> None:
    table = [list(columns), *body]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))


def write(out: Path, report: dict[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
    """DIR/prefix.json (everything) and DIR/prefix.md (the tables and the notes)."""
    out.mkdir(parents=True, exist_ok=True)
    report = report | {"rows": list(rows)}
    report["machine"] = report.get("machine", {}) | {"loadavg_at_end": os.getloadavg()}
    (out / "prefix.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    (out / "prefix.md").write_text(markdown(rows, report.get("notes", [])))
    print(f"wrote {out / 'prefix.json'} and {out / 'prefix.md'}")
