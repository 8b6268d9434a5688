"""What a person sees: a live progress line, a summary table and result.json.

The progress line is a plain stderr line rewritten with \\r, so it needs no terminal library
and stays out of stdout, which carries only the final table. When stderr is not a terminal (a
log file, CI) a \\r does not rewrite anything, so a whole line is written every `log_every`
seconds instead of one per half second run together.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TextIO

import orjson

from loadtest.gen.shapes import RunState

METRICS = (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms"))
COLUMNS = ("mean", "p50", "p90", "p99", "max")


def progress_text(state: RunState) -> str:
    elapsed = state.elapsed()
    rps = state.finished / elapsed if elapsed > 0 else 0.0
    ok = state.finished - state.errors - state.cut
    text = (
        f"[{elapsed:6.1f}s] done {state.finished} ok {ok} err {state.errors} "
        f"in-flight {state.in_flight} {rps:.1f} req/s"
    )
    if state.cut:
        text += f" cut {state.cut}"
    duration, cut_at = state.duration, state.cut_at
    if duration is not None and cut_at is not None and elapsed >= duration and state.in_flight:
        text += f", grace: cut at {cut_at:g}s"
    return text


async def show_progress(
    state: RunState, stream: TextIO, every: float = 0.5, log_every: float = 10.0
) -> None:
    """Runs until cancelled; the line is padded so a shorter one fully covers a longer one."""
    if not stream.isatty():
        await _log_progress(state, stream, log_every)
        return
    width = 0
    try:
        while True:
            text = progress_text(state)
            width = max(width, len(text))
            stream.write("\r" + text.ljust(width))
            stream.flush()
            await asyncio.sleep(every)
    finally:
        stream.write("\r" + progress_text(state).ljust(width) + "\n")
        stream.flush()


async def _log_progress(state: RunState, stream: TextIO, every: float) -> None:
    try:
        while True:
            await asyncio.sleep(every)
            stream.write(progress_text(state) + "\n")
            stream.flush()
    finally:
        stream.write(progress_text(state) + "\n")
        stream.flush()


def _cell(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else "-"


def _rate(value: object) -> str:
    """A rate, with two decimals below 1 so a slow run's few answers do not read as 0.0."""
    if isinstance(value, int | float) and 0 < value < 1:
        return f"{value:.2f}"
    return _cell(value)


def summary_table(summary: dict[str, object]) -> str:
    lines = [
        f"requests {summary['requests']}  succeeded {summary['succeeded']}  "
        f"failed {summary['failed']}  wall {_cell(summary['wall_s'])} s",
        f"throughput {_rate(summary['request_throughput_rps'])} req/s  "
        f"{_cell(summary['output_token_throughput_tps'])} output tok/s",
        "",
        f"{'ms':<6}" + "".join(f"{c:>10}" for c in COLUMNS) + f"{'samples':>10}",
    ]
    for label, key in METRICS:
        dist = summary[key]
        assert isinstance(dist, dict)
        cells = "".join(f"{_cell(dist[c]):>10}" for c in COLUMNS)
        lines.append(f"{label:<6}{cells}{dist['count']:>10}")
    lines += ["", _goodput_line(summary), _errors_line(summary)]
    return "\n".join(lines)


def _goodput_line(summary: dict[str, object]) -> str:
    good = summary["goodput"]
    assert isinstance(good, dict)
    slo = good["slo"]
    frac = good["fraction"]
    share = f"{frac * 100:.1f}%" if isinstance(frac, float) else "-"
    return (
        f"goodput {good['requests']} requests ({share}), {_cell(good['rps'])} req/s "
        f"under SLO ttft<={_limit(slo['ttft_ms'])} tpot<={_limit(slo['tpot_ms'])}"
    )


def _limit(value: object) -> str:
    return f"{value:g} ms" if isinstance(value, int | float) else "any"


def _errors_line(summary: dict[str, object]) -> str:
    errors = summary["errors"]
    assert isinstance(errors, dict)
    if not errors:
        return "errors: none"
    return "errors: " + ", ".join(f"{kind} {n}" for kind, n in errors.items())


LENGTH_ROWS = (
    ("input words", "input_words", "input_len", "prompts as given"),
    ("input tokens", "input_tokens", "prompt_tokens", "no tokenizer"),
    ("prompt tokens", "prompt_tokens", None, "server usage"),
    ("max_tokens", "max_tokens", "output_len", "not sent"),
    ("output tokens", "output_tokens", None, "counted"),
)


def lengths_section(result: dict[str, object]) -> str:
    """Asked-for lengths next to what the server reports, so a gap between them shows."""
    config, summary = result["config"], result["summary"]
    assert isinstance(config, dict) and isinstance(summary, dict)
    found = summary["lengths"]
    assert isinstance(found, dict)
    columns = ("mean", "p50", "p90", "max")
    lines = [f"{'lengths':<15}{'spec':<22}" + "".join(f"{c:>9}" for c in columns)]
    for label, key, spec_key, otherwise in LENGTH_ROWS:
        dist = found[key]
        spec = config.get(spec_key) if spec_key is not None else None
        if key == "input_words" and config.get("prompt_tokens") is not None:
            spec = "set in tokens"
        if spec_key == "output_len" and spec is not None and config.get("output_len_default"):
            spec = f"{spec} (default)"
        cells = "".join(f"{_cell(dist[c]):>9}" for c in columns)
        lines.append(f"{label:<15}{spec or otherwise:<22}{cells}")
    return "\n".join([*lines, *_token_notes(config, summary)])


def _token_notes(config: dict[str, object], summary: dict[str, object]) -> list[str]:
    """How exact the token lengths are: the prompt's tokenizer and the answers' counter."""
    notes = []
    if config.get("prompt_tokens") is not None:
        source = config.get("tokenizer")
        notes.append(
            f"prompt tokens sent: exact, tokenizer {source}"
            if source is not None
            else "prompt tokens sent: APPROXIMATE, no tokenizer known for this model (about "
            "0.75 words a token); give --tokenizer PATH for exact lengths"
        )
    counted = summary.get("output_tokens_from")
    if isinstance(counted, dict) and counted:
        how = ", ".join(f"{COUNTED_FROM.get(k, k)} {n}" for k, n in counted.items())
        notes.append(f"output tokens counted from: {how}")
    return notes


COUNTED_FROM = {
    "usage": "server usage",
    "token_ids": "token ids",
    "tokenizer": "local tokenizer",
    "chunks": "stream chunks (approximate)",
    "estimate": "words (approximate)",
}


def write_result(out_dir: Path, result: dict[str, object]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "result.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    tmp.replace(path)
    return path


def actions_section(actions: list[dict[str, object]]) -> str:
    """Scenario actions as fired, with how long the load took to be error-free again."""
    lines = ["Actions", f"{'at s':>7} {'fired s':>8} {'failover s':>11} {'failed':>7}  action"]
    for a in actions:
        failover = a["failover_s"]
        recovered = _cell(failover) if failover is not None or a["outcome"] != "ok" else "never"
        failed = a["failed_after"] if a["failed_after"] is not None else "-"
        lines.append(
            f"{_cell(a['at']):>7} {_cell(a['fired_s']):>8} {recovered:>11} {failed:>7}  "
            f"{a['action']}: {a['outcome']}"
        )
    return "\n".join(lines)
