"""`--sweep-concurrency 1,4,16` / `--sweep-rate 1,2,4`: one workload at several load levels.

Every point is a full run with the same bounds (duration and/or request count) and a fresh,
identically seeded workload, so the points differ only in the load and line up as a curve.
All points share one client session: connections opened by a point stay warm for the next,
so a point's first requests do not pay connection setup that the previous point did not.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp
import orjson

from loadtest.gen.client import open_session
from loadtest.gen.compare import HEADLINE, cell, headline
from loadtest.gen.report import write_result
from loadtest.gen.shapes import RunConfig

Load = Callable[[RunConfig, aiohttp.ClientSession], Awaitable[dict[str, object]]]


def _points(kind: type[int] | type[float]) -> Callable[[str], list[float]]:
    def parse(text: str) -> list[float]:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers: {text}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"need one or more values > 0: {text}")
        return values

    return parse


def add_options(group: argparse._MutuallyExclusiveGroup) -> None:
    """Joins the shape group: a sweep replaces --concurrency/--rate, it cannot be combined."""
    group.add_argument("--sweep-concurrency", type=_points(int), metavar="N,N,...",
                       help="closed loop at each concurrency in turn")  # fmt: skip
    group.add_argument("--sweep-rate", type=_points(float), metavar="R,R,...",
                       help="open loop at each rate in turn")  # fmt: skip


def axis_of(args: argparse.Namespace) -> tuple[str, list[float]] | None:
    if args.sweep_concurrency:
        return "concurrency", list(args.sweep_concurrency)
    if args.sweep_rate:
        return "rate", list(args.sweep_rate)
    return None


def point_config(base: RunConfig, axis: str, value: float) -> RunConfig:
    if axis == "concurrency":
        return dataclasses.replace(base, concurrency=int(value), rate=None)
    return dataclasses.replace(base, concurrency=None, rate=float(value))


async def run_sweep(
    base: RunConfig,
    axis: str,
    values: Sequence[float],
    load: Load,
    out: Path | None,
    on_point: Callable[[dict[str, object], Path], object] | None = None,
) -> list[dict[str, object]]:
    """Runs the points in order; each is saved as soon as it ends, so an abort keeps them."""
    pool = int(max(values)) if axis == "concurrency" else None
    async with open_session(pool) as session:
        return await _points_in_turn(base, axis, values, load, session, out, on_point)


async def _points_in_turn(
    base: RunConfig,
    axis: str,
    values: Sequence[float],
    load: Load,
    session: aiohttp.ClientSession,
    out: Path | None,
    on_point: Callable[[dict[str, object], Path], object] | None,
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i, value in enumerate(values):
        result = await load(point_config(base, axis, value), session)
        summary = result["summary"]
        assert isinstance(summary, dict)
        rows.append({"point": i, axis: value, **headline(summary)})
        if out is not None:
            point_dir = out / f"point-{i}"
            write_result(point_dir, result)
            if on_point is not None:
                on_point(result, point_dir)
            write_sweep(out, axis, rows)
    return rows


def write_sweep(out: Path, axis: str, rows: Sequence[Mapping[str, object]]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.json"
    doc = {"axis": axis, "metrics": [label for label, _ in HEADLINE], "points": list(rows)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    return path


def sweep_table(axis: str, rows: Sequence[Mapping[str, object]]) -> str:
    labels = [label for label, _ in HEADLINE]
    widths = [max(len(label) + 2, 9) for label in labels]
    head = f"{'point':>5}{axis:>12}" + "".join(
        f"{lb:>{w}}" for lb, w in zip(labels, widths, strict=True)
    )
    lines = [head]
    for row in rows:
        cells = "".join(
            f"{cell(row[lb], 4 if lb == 'error rate' else 1):>{w}}"
            for lb, w in zip(labels, widths, strict=True)
        )
        lines.append(f"{row['point']!s:>5}{row[axis]!s:>12}{cells}")
    return "\n".join(lines)
