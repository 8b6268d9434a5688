"""The lines under the summary table that say what bounded the run and what to change: the
max_tokens sent by default, the grace after `--duration` and the requests that timed out."""

from __future__ import annotations

from collections.abc import Mapping


def run_notes(result: Mapping[str, object]) -> list[str]:
    config, summary = result["config"], result["summary"]
    assert isinstance(config, Mapping) and isinstance(summary, Mapping)
    lines = (_max_tokens(config), _grace(config, summary), _timeouts(config, summary))
    return [line for line in lines if line is not None]


def _requests(n: object) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


def _shorter(config: Mapping[str, object]) -> str:
    """How to make answers shorter: lower --max-tokens, or set one when none is sent."""
    return "lower --max-tokens" if config.get("output_len") is not None else "set --max-tokens"


def _max_tokens(config: Mapping[str, object]) -> str | None:
    if not config.get("output_len_default"):
        return None
    return (
        f"max_tokens: {config['output_len']} by default (as vllm bench serve); "
        "--max-tokens N to change, 0 to send none"
    )


def _grace(config: Mapping[str, object], summary: Mapping[str, object]) -> str | None:
    duration, grace = config.get("duration_s"), config.get("grace_s")
    if not isinstance(duration, int | float) or not isinstance(grace, int | float):
        return None
    ended, cut = summary["ended_in_grace"], summary["cut"]
    line = (
        f"grace: {_requests(ended)} ended within the {grace:g} s --grace after --duration "
        f"{duration:g} s, counted above; {cut} cut"
    )
    if cut:
        line += f" at its end, still answering, not counted: raise --grace or {_shorter(config)}"
    return line


def _timeouts(config: Mapping[str, object], summary: Mapping[str, object]) -> str | None:
    errors = summary["errors"]
    timed_out = errors.get("timeout") if isinstance(errors, Mapping) else None
    timeout = config.get("timeout_s")
    if not timed_out or not isinstance(timeout, int | float):
        return None
    return (
        f"{_requests(timed_out)} timed out after {timeout:g} s; "
        f"raise --timeout or {_shorter(config)}"
    )
