"""`python -m loadtest compare A B`: two runs side by side, with B/A ratios.

Comparisons are made from result.json files rather than live runs so that a direct-to-unit
baseline and a through-the-gateway run taken at different times can still be set side by side.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import orjson

# (label, path into the summary); a path of two keys is (distribution, statistic).
HEADLINE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("req/s", ("request_throughput_rps",)),
    ("tok/s", ("output_token_throughput_tps",)),
    ("TTFT p50 ms", ("ttft_ms", "p50")),
    ("TTFT p99 ms", ("ttft_ms", "p99")),
    ("ITL p50 ms", ("itl_ms", "p50")),
    ("ITL p99 ms", ("itl_ms", "p99")),
    ("TPOT p50 ms", ("tpot_ms", "p50")),
    ("TPOT p99 ms", ("tpot_ms", "p99")),
    ("E2E p50 ms", ("e2e_ms", "p50")),
    ("E2E p99 ms", ("e2e_ms", "p99")),
    ("error rate", ("error_rate",)),
    ("goodput req/s", ("goodput", "rps")),
)


class ResultError(ValueError):
    """A result file that cannot be read; reported as one line, not a traceback."""


def load_result(path: Path) -> dict[str, object]:
    """Accepts the run directory as well as the file, since that is what --out was given."""
    file = path / "result.json" if path.is_dir() else path
    try:
        data = orjson.loads(file.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ResultError(f"cannot read {file}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("summary"), dict):
        raise ResultError(f"{file} is not a loadtest result (no summary)")
    return data


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def headline(summary: Mapping[str, object]) -> dict[str, float | None]:
    """Error rate is derived here because the summary keeps only counts."""
    requests, failed = summary.get("requests"), summary.get("failed")
    rate = failed / requests if isinstance(failed, int) and isinstance(requests, int) else None
    flat: dict[str, object] = {**summary, "error_rate": rate if requests else None}
    out: dict[str, float | None] = {}
    for label, keys in HEADLINE:
        value: object = flat
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        out[label] = _number(value)
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def compare(a: Mapping[str, object], b: Mapping[str, object]) -> list[dict[str, object]]:
    """One row per headline metric: the two values and B/A (None when undefined)."""
    ha, hb = headline(_summary(a)), headline(_summary(b))
    return [
        {"metric": label, "a": ha[label], "b": hb[label], "ratio": ratio(ha[label], hb[label])}
        for label, _ in HEADLINE
    ]


def _summary(result: Mapping[str, object]) -> Mapping[str, object]:
    summary = result.get("summary")
    return summary if isinstance(summary, Mapping) else {}


def cell(value: object, digits: int = 2) -> str:
    if not isinstance(value, int | float):
        return "-"
    return f"{value:.{digits}f}" if abs(value) < 1e6 else f"{value:.3g}"


def compare_table(rows: Sequence[Mapping[str, object]], names: Sequence[str]) -> str:
    a, b = names
    lines = [f"{'metric':<15}{a:>14}{b:>14}{f'{b}/{a}':>16}"]
    for row in rows:
        digits = 4 if row["metric"] == "error rate" else 2
        lines.append(
            f"{row['metric']!s:<15}{cell(row['a'], digits):>14}{cell(row['b'], digits):>14}"
            f"{cell(row['ratio'], 3):>16}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unitgate loadtest compare", description=__doc__)
    p.add_argument("a", type=Path, help="baseline result.json (or its directory)")
    p.add_argument("b", type=Path, help="result.json to compare against the baseline")
    p.add_argument("--names", nargs=2, default=["A", "B"], metavar=("NAME_A", "NAME_B"))
    p.add_argument("--out", type=Path, help="also write the comparison as JSON here")
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        rows = compare(load_result(args.a), load_result(args.b))
    except ResultError as exc:
        print(f"unitgate loadtest compare: {exc}", file=sys.stderr)
        return 2
    print(compare_table(rows, args.names))
    if args.out is None:
        return 0
    doc = {"names": args.names, "files": [str(args.a), str(args.b)], "rows": rows}
    try:
        args.out.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    except OSError as exc:
        print(f"unitgate loadtest compare: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    return 0
