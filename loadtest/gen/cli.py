"""`python -m loadtest --url URL ...`: parse options, run one shape, report, judge.

Everything the user can get wrong (options, a prompt file, a tokenizer, the output directory)
ends in a one-line message and exit status 2; server misbehaviour is data and ends in the
report, and the checks (`--max-error-rate`, `--slo`) turn it into exit status 1. Without
`--model`, a target that cannot list its models ends the run before any load (status 3).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop

from gateway.base.oslimits import raise_fd_limit
from loadtest.gen import compare, options, plots, sweep
from loadtest.gen.actions import ActionRunner, add_timeseries
from loadtest.gen.checks import Check, Verdict, checks_section, judge
from loadtest.gen.lengths import LengthDist
from loadtest.gen.notes import run_notes
from loadtest.gen.options import EXIT_CHECKS, EXIT_OK, EXIT_TARGET, EXIT_USAGE
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
from loadtest.gen.target import TargetError, build_headers, choose_model, list_models
from loadtest.gen.tokens import TokenCounter, TokenizerError, load_tokenizer, packaged_tokenizer
from loadtest.gen.workload import Workload, WorkloadConfig, WorkloadError, load_jsonl


def _configs(
    args: argparse.Namespace,
    lengths: options.Lengths,
    model: str,
    headers: tuple[tuple[str, str], ...],
    grace: float,
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
        headers=headers,
        grace=grace if args.duration is not None else None,
    )
    work = WorkloadConfig(
        model,
        session_share=args.session_share,
        sessions=args.sessions,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
        input_len=lengths.input_len,
        output_len=lengths.output_len,
        prompt_tokens=lengths.prompt_tokens,
        endpoint=args.endpoint,
        stream=not args.no_stream,
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
    output_default: bool = False,
) -> dict[str, object]:
    """Run one shape and build the whole result document; `session` as for `Runner`.
    `output_default`: the max_tokens sent is the CLI's default, not one the user gave."""
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
        "config": _config_json(run, workload, slo, started, output_default),
        "summary": aggregate(records, state.elapsed(), slo),
        "requests": [record_json(r) for r in records],
    }
    if series or outcomes is not None:
        add_timeseries(result, state, outcomes)
    return result


def add_checks(result: dict[str, object], checks: list[Check]) -> list[Verdict]:
    """Judge the summary; the verdicts also go into `result["checks"]`."""
    summary = result["summary"]
    assert isinstance(summary, dict)
    verdicts = judge(checks, summary)
    result["checks"] = [v.to_json() for v in verdicts]
    return verdicts


def _config_json(
    run: RunConfig, workload: Workload, slo: Slo, started: float, output_default: bool
) -> dict[str, object]:
    w = workload.config
    return {
        "url": run.url,
        "model": w.model,
        "shape": "closed" if run.concurrency is not None else "open",
        "concurrency": run.concurrency,
        "rate": run.rate,
        "duration_s": run.duration,
        "grace_s": run.grace,
        "requests": run.requests,
        "timeout_s": run.timeout,
        "endpoint": w.endpoint,
        "stream": w.stream,
        "input_len": _spec(w.inputs),
        "prompt_tokens": _spec(w.prompt_tokens),
        "tokenizer": None if workload.tokenizer is None else workload.tokenizer.source,
        "output_len": _spec(w.outputs),
        "output_len_default": output_default,
        "ignore_eos": w.ignore_eos,
        "session_share": w.session_share,
        "sessions": w.sessions,
        "seed": run.seed,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "header_names": [name for name, _ in run.headers],  # values may be secrets
        "started_unix": started,
    }


def _spec(dist: LengthDist | None) -> str | None:
    return None if dist is None else dist.spec


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    parser = options.build_parser(__doc__)
    args = parser.parse_args(argv)
    options.check(parser, args)
    checks, lengths = options.checks(parser, args), options.length_specs(parser, args)
    grace = options.grace(parser, args)
    try:
        headers = build_headers(args.header, args.api_key)
    except ValueError as exc:
        parser.error(str(exc))
    raise_fd_limit()  # a closed loop of 10,000 streams holds 10,000 connections
    try:
        inputs = _inputs(args, headers)
    except (WorkloadError, ScenarioError, TokenizerError) as exc:
        return _fail(str(exc), EXIT_USAGE)
    except TargetError as exc:
        return _fail(f"{exc}; give the model with --model", EXIT_TARGET)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    run, work = _configs(args, lengths, inputs.model, headers, grace)
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    if (axis := sweep.axis_of(args)) is not None:
        return _sweep(args, run, work, inputs, slo, axis, checks, lengths.output_default)
    workload = Workload(work, inputs.prompts, inputs.tokenizer)
    return _run_once(args, run, workload, slo, inputs, checks, lengths.output_default)


@dataclass(frozen=True, slots=True)
class _Inputs:
    """What the run needs from files and from the target, all read before any load."""

    prompts: list[str] | None
    scenario: list[Action] | None
    model: str
    tokenizer: TokenCounter | None


def _inputs(args: argparse.Namespace, headers: tuple[tuple[str, str], ...]) -> _Inputs:
    """Files first, so a typo is reported before the target is asked anything."""
    prompts = load_jsonl(args.prompts) if args.prompts is not None else None
    scenario = load_scenario(args.scenario) if args.scenario is not None else None
    given = None if args.tokenizer in ("auto", "none") else load_tokenizer(Path(args.tokenizer))
    model = args.model or _served_model(args.url.rstrip("/"), headers)
    return _Inputs(prompts, scenario, model, given or _auto_tokenizer(args, model))


def _run_once(
    args: argparse.Namespace,
    run: RunConfig,
    workload: Workload,
    slo: Slo,
    inputs: _Inputs,
    checks: list[Check],
    output_default: bool,
) -> int:
    progress, scenario = not args.no_progress, inputs.scenario
    try:
        load = run_load(
            run, workload, slo, progress, scenario, args.timeseries, output_default=output_default
        )
        result = uvloop.run(load)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    verdicts = add_checks(result, checks)
    _print(result, verdicts)
    saved = _save(args.out, result)
    passed = all(v.passed for v in verdicts)
    return saved if saved != EXIT_OK else (EXIT_OK if passed else EXIT_CHECKS)


def _fail(message: str, status: int) -> int:
    print(f"unitgate loadtest: {message}", file=sys.stderr)
    return status


def _served_model(url: str, headers: tuple[tuple[str, str], ...]) -> str:
    """The model `GET /v1/models` lists, said on stderr (stdout carries only the report)."""
    model, why = choose_model(uvloop.run(list_models(url, headers)))
    print(why, file=sys.stderr)
    return model


def _auto_tokenizer(args: argparse.Namespace, model: str) -> TokenCounter | None:
    """`auto` loads the model's packaged tokenizer only when prompt lengths are asked in
    tokens: the server's usage counts the answers, and loading one takes seconds."""
    if args.tokenizer != "auto" or args.prompt_tokens is None:
        return None
    return packaged_tokenizer(model)


def _print(result: dict[str, object], verdicts: list[Verdict]) -> None:
    summary = result["summary"]
    assert isinstance(summary, dict)
    print(summary_table(summary))
    for line in run_notes(result):
        print(line)
    print("\n" + lengths_section(result))
    if isinstance(actions := result.get("actions"), list):
        print("\n" + actions_section(actions))
    print("\n" + checks_section(verdicts))


def _save(out: Path | None, result: dict[str, object]) -> int:
    if out is None:
        return EXIT_OK
    try:
        path = write_result(out, result)
    except OSError as exc:
        return _fail(f"cannot write result: {exc}", EXIT_USAGE)
    print(f"result: {path}")
    plots.try_write_plots(result, out)
    return EXIT_OK


# --- Output extras: `compare` / `plot` subcommands, sweeps, plots ---------------------------------
# A first word naming a subcommand selects it; anything else is the flag-based run CLI above,
# so `python -m loadtest --url ...` is unchanged.
SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {"compare": compare.main, "plot": plots.main}


def _sweep(
    args: argparse.Namespace,
    run: RunConfig,
    work: WorkloadConfig,
    inputs: _Inputs,
    slo: Slo,
    axis: tuple[str, list[float]],
    checks: list[Check],
    output_default: bool,
) -> int:
    """Each point gets a fresh copy of the workload so all points send the same requests;
    every point is judged, and the sweep fails when any point does."""
    name, values = axis
    failed: list[str] = []

    async def load(point: RunConfig, session: aiohttp.ClientSession) -> dict[str, object]:
        workload = Workload(work, inputs.prompts, inputs.tokenizer)
        progress = not args.no_progress
        result = await run_load(
            point, workload, slo, progress, session=session, output_default=output_default
        )
        value = point.concurrency if name == "concurrency" else point.rate
        failed.extend(
            f"{name} {value:g}: {v.detail}" for v in add_checks(result, checks) if not v.passed
        )
        return result

    try:
        rows = uvloop.run(sweep.run_sweep(run, name, values, load, args.out, plots.try_write_plots))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except OSError as exc:
        return _fail(f"cannot write result: {exc}", EXIT_USAGE)
    print(sweep.sweep_table(name, rows))
    if args.out is not None:
        print(f"sweep: {args.out / 'sweep.json'}")
    print("\nchecks: " + ("all passed at every point" if not failed else f"{len(failed)} failed"))
    for line in failed:
        print(f"  FAIL  {line}")
    return EXIT_CHECKS if failed else EXIT_OK
