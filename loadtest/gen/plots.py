"""PNG charts of a run, drawn only from result.json so they can be redrawn at any time.

matplotlib is the optional "loadtest" extra: it is imported on first use, and its absence is
a one-line message, never an ImportError from the load generator itself. The object API
(Figure, no pyplot) is used so no GUI backend or global figure state is ever involved.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtest.gen.compare import ResultError, load_result

INSTALL_HINT = "matplotlib is not installed; install the extra: pip install 'unitgate[loadtest]'"
# (title, per-request field in result.json); records carry only a per-request mean ITL.
CDF_FIELDS = (
    ("TTFT", "ttft_ms"),
    ("ITL (per-request mean)", "itl_mean_ms"),
    ("TPOT", "tpot_ms"),
    ("E2E", "e2e_ms"),
)
TIME_KEYS = ("t", "t_s", "second", "start_s", "at")


class PlotError(RuntimeError):
    """Plots cannot be drawn (matplotlib missing); the run itself is still good."""


def _figure(**kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError(INSTALL_HINT) from None
    return Figure(**kwargs)


def write_plots(result: Mapping[str, object], out_dir: Path) -> list[Path]:
    """Time-series charts are drawn only when the run recorded a time series."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [_latency_cdf(_list(result.get("requests")), out_dir / "latency_cdf.png")]
    series = _buckets(result.get("timeseries"))
    if series:
        actions = _list(result.get("actions"))
        written.append(_throughput(series, actions, out_dir / "throughput.png"))
        written.append(_errors(series, actions, out_dir / "errors.png"))
    return written


def _list(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _buckets(value: object) -> list[Mapping[str, Any]]:
    """Tolerates {"buckets": [...]} as well as a bare list, to survive format tweaks."""
    if isinstance(value, Mapping):
        value = value.get("buckets")
    return _list(value)


def _num(bucket: Mapping[str, Any], *keys: str) -> float:
    for key in keys:
        value = bucket.get(key)
        if isinstance(value, int | float):
            return float(value)
    return 0.0


def _times(series: Sequence[Mapping[str, Any]]) -> list[float]:
    """Buckets are one second wide; without a time field, the position is the second."""
    return [
        _num(b, *TIME_KEYS) if any(k in b for k in TIME_KEYS) else float(i)
        for i, b in enumerate(series)
    ]


def _latency_cdf(requests: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig = _figure(figsize=(10, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    for ax, (title, key) in zip(axes.flat, CDF_FIELDS, strict=True):
        values = sorted(float(v) for r in requests if isinstance(v := r.get(key), int | float))
        ax.set_title(f"{title} ({len(values)} samples)")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post")
        else:
            ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("Latency CDFs (successful requests)")
    fig.savefig(path, format="png", dpi=100)
    return path


def _mark_actions(ax: Any, actions: Sequence[Mapping[str, Any]]) -> None:
    for action in actions:
        at = action.get("at")
        if not isinstance(at, int | float):
            continue
        ax.axvline(at, color="tab:red", linestyle="--", linewidth=1)
        label = str(action.get("kind", "action"))
        ax.annotate(label, (at, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                    va="top", ha="right", fontsize=8, color="tab:red")  # fmt: skip


def _throughput(series: Sequence[Mapping[str, Any]], actions: Any, path: Path) -> Path:
    times = _times(series)
    fig = _figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(times, [_num(b, "completed") for b in series], drawstyle="steps-post")
    top.set_ylabel("completed req/s")
    bottom.plot(times, [_num(b, "output_tokens", "tokens") for b in series],
                drawstyle="steps-post", color="tab:green")  # fmt: skip
    bottom.set_ylabel("output tokens/s")
    bottom.set_xlabel("seconds since start")
    for ax in (top, bottom):
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        _mark_actions(ax, actions)
    fig.suptitle("Throughput over time")
    fig.savefig(path, format="png", dpi=100)
    return path


def _errors(series: Sequence[Mapping[str, Any]], actions: Any, path: Path) -> Path:
    fig = _figure(figsize=(10, 4), layout="constrained")
    ax = fig.subplots()
    ax.bar(_times(series), [_num(b, "failed") for b in series], width=1.0, align="edge",
           color="tab:red", alpha=0.7)  # fmt: skip
    ax.set_ylabel("failed requests/s")
    ax.set_xlabel("seconds since start")
    ax.grid(True, alpha=0.3)
    _mark_actions(ax, actions)
    fig.suptitle("Failures over time")
    fig.savefig(path, format="png", dpi=100)
    return path


def try_write_plots(result: Mapping[str, object], out_dir: Path) -> list[Path]:
    """For runs: a missing matplotlib or unwritable chart is a warning, the result stands."""
    try:
        return write_plots(result, out_dir)
    except (PlotError, OSError) as exc:
        print(f"unitgate loadtest: no plots: {exc}", file=sys.stderr)
        return []


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="unitgate loadtest plot", description=__doc__)
    p.add_argument("result", type=Path, help="result.json or the run directory holding it")
    p.add_argument("--out", type=Path, help="directory for the PNGs (default: beside result)")
    args = p.parse_args(list(argv))
    out = args.out or (args.result if args.result.is_dir() else args.result.parent)
    try:
        paths = write_plots(load_result(args.result), out)
    except (ResultError, PlotError, OSError) as exc:
        print(f"unitgate loadtest plot: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"plot: {path}")
    return 0
