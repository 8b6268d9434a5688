"""This node's `vllm serve` arguments, parsed by vLLM's own parser into the Namespace its
OpenAI server and `AsyncEngineArgs.from_cli_args` read.

`--vllm-args` names arguments as vLLM's dataclasses do (`tool_call_parser`, `max_model_len`),
with JSON values; vLLM's YAML `--config` files do the same. Each becomes the command-line words
`vllm serve` would get, chosen by the option's own kind (a switch, a list, a JSON value), so
every value goes through the conversion and checks `vllm serve` applies to it. Imports vLLM.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from engine.backends.vllm.args import check_known, engine_kwargs, known_engine_args
from engine.settings import NodeSettings

WHERE = "--vllm-args"


def serve_args(settings: NodeSettings) -> argparse.Namespace:
    """Everything this node runs with; a bad key or value raises ValueError naming it."""
    kwargs = engine_kwargs(settings)
    check_known(kwargs, known_engine_args(), WHERE)
    if settings.is_leader:
        kwargs |= {"host": settings.host, "port": settings.port}
    parser = _parser()
    try:
        args = parser.parse_args(argv(parser, kwargs))
    except argparse.ArgumentError as exc:
        raise ValueError(f"{WHERE}: {exc}") from None
    if settings.is_leader:
        _check_server(args)
    return args


def build_engine_args(args: argparse.Namespace) -> Any:
    """vLLM's AsyncEngineArgs from the Namespace, as `vllm serve` builds them."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import propagate_flash_late_interaction

    engine_args = AsyncEngineArgs.from_cli_args(args)
    propagate_flash_late_interaction(args, engine_args)
    return engine_args


def argv(parser: argparse.ArgumentParser, kwargs: dict[str, Any]) -> list[str]:
    """`{"enforce_eager": true, "api_key": ["k"]}` -> `--enforce-eager --api-key k`."""
    words: list[str] = []
    for key, value in kwargs.items():
        option = "--" + key.replace("_", "-")
        action = parser._option_string_actions.get(option)
        if action is None or key.startswith("_"):
            raise ValueError(f"{WHERE}: {key!r} is not a vLLM engine or server argument")
        words += _words(option, action, value)
    return words


def _words(option: str, action: argparse.Action, value: Any) -> list[str]:
    if value is None:
        return []  # vLLM's own default for the key
    if isinstance(value, bool) and action.nargs == 0:  # a switch: --x, --no-x, store_true
        if isinstance(action, argparse.BooleanOptionalAction):
            return [option if value else "--no-" + option[2:]]
        return [option] if value == action.const else []
    if isinstance(action, argparse._AppendAction):
        return [w for item in _items(value) for w in (option, _text(item))]
    if action.nargs in ("+", "*"):
        return [option, *(_text(item) for item in _items(value))]
    return [f"{option}={_text(value)}"]  # one word: a value may start with "-"


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _parser() -> argparse.ArgumentParser:
    """`vllm serve`'s parser, raising on a bad value instead of exiting."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser: argparse.ArgumentParser = make_arg_parser(
        FlexibleArgumentParser(prog="vllm serve", exit_on_error=False)
    )
    return parser


def _check_server(args: argparse.Namespace) -> None:
    """vLLM's own start-up checks of its server's arguments (a tool parser's name, a chat
    template, --enable-auto-tool-choice without a parser), before the engine starts."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import validate_api_server_args

    try:
        validate_parsed_serve_args(args)
        validate_api_server_args(args)
    except (KeyError, TypeError, ValueError) as exc:
        message = exc.args[0] if exc.args else exc  # KeyError's str() adds quotes
        raise ValueError(f"{WHERE}: {message}") from None
