"""The run CLI's flags and their checks: every mistake ends in argparse's one-line message and
exit status 2 (`EXIT_USAGE`), before anything is sent."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from loadtest.gen import sweep
from loadtest.gen.checks import Check, CheckError, max_error_rate, parse_slo
from loadtest.gen.lengths import FORMS, LengthDist, LengthSpecError, parse_length
from loadtest.gen.target import API_KEY_ENV

EXIT_OK, EXIT_CHECKS, EXIT_USAGE, EXIT_TARGET = 0, 1, 2, 3
DEFAULT_MAX_TOKENS = 128  # `vllm bench serve`'s output length for its random dataset
DEFAULT_GRACE_S = 30.0  # as k6's gracefulStop
EPILOG = f"""exit status: {EXIT_OK} every check passed; {EXIT_CHECKS} a check failed (error rate
or an --slo); {EXIT_USAGE} a usage error (flags, files); {EXIT_TARGET} without --model, the
target could not list its models; 130 interrupted."""


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="unitgate loadtest", description=description, epilog=EPILOG)
    p.add_argument("--url", required=True, help="server base URL; /v1/... is appended")
    p.add_argument("--model", help="model to ask for (default: what GET /v1/models lists)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--concurrency", type=int, help="closed loop: requests kept in flight")
    shape.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    sweep.add_options(shape)
    p.add_argument("--duration", type=float, help="seconds during which requests are sent")
    p.add_argument(
        "--grace",
        type=float,
        metavar="S",
        help="after --duration, seconds the requests in flight may take to finish; those "
        f"still going are then cut (default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument("--requests", type=int, help="total requests to send")
    p.add_argument("--prompts", type=Path, help="JSONL prompt file (default: shopping set)")
    _add_request(p)
    _add_lengths(p)
    p.add_argument("--session-share", type=float, default=0.0, help="share sending x-session-id")
    p.add_argument("--sessions", type=int, default=16, help="distinct session ids in the pool")
    _add_checks(p)
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="directory for result.json")
    p.add_argument("--no-progress", action="store_true", help="no live progress line")
    p.add_argument("--scenario", type=Path, help="TOML file of actions fired during the run")
    p.add_argument("--timeseries", action="store_true", help="add 1 s buckets to result.json")
    return p


def _add_request(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--endpoint",
        choices=("chat", "completions"),
        default="chat",
        help="/v1/chat/completions (default) or /v1/completions",
    )
    p.add_argument(
        "--no-stream",
        action="store_true",
        help="ask for whole answers (no TTFT or ITL then, only end-to-end)",
    )
    p.add_argument(
        "--api-key", help=f"sent as 'Authorization: Bearer KEY' (default: ${API_KEY_ENV})"
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="extra request header, repeatable",
    )


def _add_lengths(p: argparse.ArgumentParser) -> None:
    """The old single-number flags stay as aliases so existing command lines keep working."""
    inputs = p.add_mutually_exclusive_group()
    inputs.add_argument(
        "--prompt-tokens",
        metavar="SPEC",
        help=f"prompt length in tokens of the model's tokenizer (exact with one, "
        f"else about 0.75 words a token), drawn from {FORMS}",
    )
    inputs.add_argument("--input-len", metavar="SPEC", help="prompt length in words, same forms")
    inputs.add_argument("--input-words", metavar="SPEC", help="alias of --input-len")
    outputs = p.add_mutually_exclusive_group()
    outputs.add_argument(
        "--max-tokens",
        metavar="SPEC",
        help=f"max_tokens of each request, drawn from SPEC (same forms; default "
        f"{DEFAULT_MAX_TOKENS}); 0 sends none, and answers run until the model stops",
    )
    outputs.add_argument("--output-len", metavar="SPEC", help="alias of --max-tokens")
    p.add_argument(
        "--tokenizer",
        metavar="PATH|auto|none",
        default="auto",
        help="tokenizer.json, its folder or a .gguf; auto: the model's packaged one "
        "when --prompt-tokens needs it; none: approximate",
    )
    eos_help = "send ignore_eos (vLLM, unitgate) so answers run to max_tokens"
    p.add_argument("--ignore-eos", action="store_true", help=eos_help)


def _add_checks(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="exit 1 when more than this share of requests failed (default 0)",
    )
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC=LIMIT",
        help="exit 1 unless met, e.g. ttft_p99=2s, e2e_p50=800ms, error_rate=1%%; repeatable",
    )
    p.add_argument("--slo-ttft-ms", type=float, help="goodput: TTFT limit")
    p.add_argument("--slo-tpot-ms", type=float, help="goodput: time-per-output-token limit")


def lengths(p: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> LengthDist | None:
    """Parsed under whichever alias the user typed, so an error message names that flag."""
    for name in names:
        if (text := getattr(args, name)) is not None:
            try:
                return parse_length(text, "--" + name.replace("_", "-"))
            except LengthSpecError as exc:
                p.error(str(exc))
    return None


@dataclass(frozen=True, slots=True)
class Lengths:
    """`output_default`: no --max-tokens was given, so `output_len` is the default."""

    input_len: LengthDist | None
    output_len: LengthDist | None
    prompt_tokens: LengthDist | None
    output_default: bool = False


def length_specs(p: argparse.ArgumentParser, args: argparse.Namespace) -> Lengths:
    given = args.max_tokens if args.max_tokens is not None else args.output_len
    if given is None:
        outputs, default = LengthDist.fixed(DEFAULT_MAX_TOKENS), True
    elif given.strip() == "0":  # no max_tokens: each answer runs until the model stops
        outputs, default = None, False
    else:
        outputs, default = lengths(p, args, "max_tokens", "output_len"), False
    return Lengths(
        lengths(p, args, "input_len", "input_words"),
        outputs,
        lengths(p, args, "prompt_tokens"),
        default,
    )


def grace(p: argparse.ArgumentParser, args: argparse.Namespace) -> float:
    """The grace after --duration; given without a --duration it would bound nothing."""
    if args.grace is None:
        return DEFAULT_GRACE_S
    if args.duration is None:
        p.error("--grace needs --duration: it follows the end of the duration")
    if not 0 <= args.grace < math.inf:
        p.error("--grace must be a number of seconds >= 0")
    return float(args.grace)


def checks(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[Check]:
    try:
        return [max_error_rate(args.max_error_rate), *(parse_slo(s) for s in args.slo)]
    except CheckError as exc:
        p.error(str(exc))


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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
    if args.model is not None and not args.model.strip():
        p.error("--model must not be empty")
