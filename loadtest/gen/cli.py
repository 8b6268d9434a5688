"""`python -m loadtest --url URL ...`: parse options, run one shape, report.

Everything the user can get wrong (options, a prompt file, the output directory) ends in a
one-line message and exit status 2; server misbehaviour is data and ends in the report.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import uvloop

from gateway.oslimits import raise_fd_limit
from loadtest.gen import compare, plots, sweep
from loadtest.gen.actions import ActionRunner, add_timeseries
from loadtest.gen.lengths import LengthDist, LengthSpecError, parse_length
from loadtest.gen.report import (
    actions_section,
    lengths_section,
    show_progress,
    summary_table,
    write_result,
)
from loadtest.gen.scenario import Action, ScenarioError, load_scenario
from loadtest.gen.shapes import RunConfig, Runner
from loadtest.gen.stats import Slo, aggregate, record_json
from loadtest.gen.workload import Workload, WorkloadConfig, WorkloadError, load_jsonl


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unitgate loadtest", description=__doc__)
    p.add_argument("--url", required=True, help="server base URL; /v1/... is appended")
    p.add_argument("--model", default="unitgate-sim")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--concurrency", type=int, help="closed loop: requests kept in flight")
    shape.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    sweep.add_options(shape)
    p.add_argument("--duration", type=float, help="seconds during which requests are sent")
    p.add_argument("--requests", type=int, help="total requests to send")
    p.add_argument("--prompts", type=Path, help="JSONL prompt file (default: shopping set)")
    _add_lengths(p)
    p.add_argument("--session-share", type=float, default=0.0, help="share sending x-session-id")
    p.add_argument("--sessions", type=int, default=16, help="distinct session ids in the pool")
    p.add_argument("--slo-ttft-ms", type=float, help="goodput: TTFT limit")
    p.add_argument("--slo-tpot-ms", type=float, help="goodput: time-per-output-token limit")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="directory for result.json")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    # Scenarios and time series (issue 5): loadtest/gen/scenario.py, actions.py, timeseries.py
    p.add_argument("--scenario", type=Path, help="TOML file of actions fired during the run")
    p.add_argument("--timeseries", action="store_true", help="add 1 s buckets to result.json")
    return p


def _add_lengths(p: argparse.ArgumentParser) -> None:
    """The old single-number flags stay as aliases so existing command lines keep working."""
    forms = "N, uniform:MIN:MAX, normal:MEAN:STDDEV or lognormal:MEAN:STDDEV"
    inputs = p.add_mutually_exclusive_group()
    inputs.add_argument("--input-len", metavar="SPEC",
                        help=f"prompt length in words (not tokens): each prompt is padded or cut "
                             f"to a length drawn from {forms}, seeded by --seed")  # fmt: skip
    inputs.add_argument("--input-words", metavar="SPEC", help="alias of --input-len")
    outputs = p.add_mutually_exclusive_group()
    outputs.add_argument(
        "--output-len",
        metavar="SPEC",
        help="max_tokens of each request, drawn from SPEC (same forms)",
    )
    outputs.add_argument("--max-tokens", metavar="SPEC", help="alias of --output-len")
    eos_help = "send ignore_eos (vLLM, unitgate) so answers run to max_tokens"
    p.add_argument("--ignore-eos", action="store_true", help=eos_help)


def _lengths(
    p: argparse.ArgumentParser, args: argparse.Namespace, *names: str
) -> LengthDist | None:
    """Parsed under whichever alias the user typed, so an error message names that flag."""
    for name in names:
        if (text := getattr(args, name)) is not None:
            try:
                return parse_length(text, "--" + name.replace("_", "-"))
            except LengthSpecError as exc:
                p.error(str(exc))
    return None


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.url.startswith(("http://", "https://")):
        p.error("--url must start with http:// or https://")
    if args.duration is None and args.requests is None:
        p.error("give --duration and/or --requests")
    positive = ("concurrency", "rate", "duration", "requests")
    for name in positive:
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not 0.0 <= args.session_share <= 1.0:
        p.error("--session-share must be within [0, 1]")
    if args.sessions < 1 or args.timeout <= 0:
        p.error("--sessions must be >= 1 and --timeout > 0")


def _configs(
    p: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[RunConfig, WorkloadConfig]:
    # Neither shape given means the simplest closed loop: one request at a time.
    concurrency = None if args.rate is not None else (args.concurrency or 1)
    run = RunConfig(
        url=args.url.rstrip("/"),
        concurrency=concurrency,
        rate=args.rate,
        duration=args.duration,
        requests=args.requests,
        timeout=args.timeout,
        seed=args.seed,
    )
    work = WorkloadConfig(
        args.model,
        session_share=args.session_share,
        sessions=args.sessions,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        input_len=_lengths(p, args, "input_len", "input_words"),
        output_len=_lengths(p, args, "output_len", "max_tokens"),
    )
    return run, work


async def run_load(
    run: RunConfig,
    workload: Workload,
    slo: Slo,
    progress: bool,
    scenario: list[Action] | None = None,
    series: bool = False,
    session: aiohttp.ClientSession | None = None,
) -> dict[str, object]:
    """Run one shape and build the whole result document; `session` as for `Runner`."""
    runner = Runner(run, workload, session)
    started = time.time()
    ticker = asyncio.create_task(show_progress(runner.state, sys.stderr)) if progress else None
    actions = ActionRunner(scenario, runner.state) if scenario else None
    if actions is not None:
        actions.start()
    try:
        state = await runner.run()
    finally:
        outcomes = await actions.stop() if actions is not None else None
        if ticker is not None:
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
    records = sorted(state.records, key=lambda r: r.index)
    result: dict[str, object] = {
        "config": _config_json(run, workload, slo, started),
        "summary": aggregate(records, state.elapsed(), slo),
        "requests": [record_json(r) for r in records],
    }
    if series or outcomes is not None:
        add_timeseries(result, state, outcomes)
    return result


def _config_json(run: RunConfig, workload: Workload, slo: Slo, started: float) -> dict[str, object]:
    w = workload.config
    return {
        "url": run.url,
        "model": w.model,
        "shape": "closed" if run.concurrency is not None else "open",
        "concurrency": run.concurrency,
        "rate": run.rate,
        "duration_s": run.duration,
        "requests": run.requests,
        "timeout_s": run.timeout,
        "input_len": _spec(w.inputs),
        "output_len": _spec(w.outputs),
        "ignore_eos": w.ignore_eos,
        "session_share": w.session_share,
        "sessions": w.sessions,
        "seed": run.seed,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "started_unix": started,
    }


def _spec(dist: LengthDist | None) -> str | None:
    return None if dist is None else dist.spec


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    run, work = _configs(parser, args)
    raise_fd_limit()  # a closed loop of 10,000 streams holds 10,000 connections
    try:
        prompts = load_jsonl(args.prompts) if args.prompts is not None else None
        scenario = load_scenario(args.scenario) if args.scenario is not None else None
    except (WorkloadError, ScenarioError) as exc:
        print(f"unitgate loadtest: {exc}", file=sys.stderr)
        return 2
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    if (axis := sweep.axis_of(args)) is not None:
        return _sweep(args, run, work, prompts, slo, axis)
    try:
        workload = Workload(work, prompts)
        load = run_load(run, workload, slo, not args.no_progress, scenario, args.timeseries)
        result = uvloop.run(load)
    except KeyboardInterrupt:
        print("unitgate loadtest: interrupted", file=sys.stderr)
        return 130
    summary = result["summary"]
    assert isinstance(summary, dict)
    print(summary_table(summary))
    print("\n" + lengths_section(result))
    if isinstance(actions := result.get("actions"), list):
        print("\n" + actions_section(actions))
    return _save(args.out, result)


def _save(out: Path | None, result: dict[str, object]) -> int:
    if out is None:
        return 0
    try:
        path = write_result(out, result)
    except OSError as exc:
        print(f"unitgate loadtest: cannot write result: {exc}", file=sys.stderr)
        return 2
    print(f"result: {path}")
    plots.try_write_plots(result, out)
    return 0


# --- Output extras (issue 5): `compare` / `plot` subcommands, sweeps, plots -----------------
# A first word naming a subcommand selects it; anything else is the flag-based run CLI above,
# so `python -m loadtest --url ...` is unchanged.
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {"compare": compare.main, "plot": plots.main}


def _sweep(
    args: argparse.Namespace,
    run: RunConfig,
    work: WorkloadConfig,
    prompts: list[str] | None,
    slo: Slo,
    axis: tuple[str, list[float]],
) -> int:
    """Each point gets a fresh copy of the workload so all points send the same requests."""
    name, values = axis

    async def load(point: RunConfig, session: aiohttp.ClientSession) -> dict[str, object]:
        workload = Workload(work, prompts)
        return await run_load(point, workload, slo, not args.no_progress, session=session)

    try:
        rows = uvloop.run(sweep.run_sweep(run, name, values, load, args.out, plots.try_write_plots))
    except KeyboardInterrupt:
        print("unitgate loadtest: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"unitgate loadtest: cannot write result: {exc}", file=sys.stderr)
        return 2
    print(sweep.sweep_table(name, rows))
    if args.out is not None:
        print(f"sweep: {args.out / 'sweep.json'}")
    return 0
