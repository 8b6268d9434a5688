"""Golden prompts: fixed requests sent to both revisions at each step, their answers compared.

A golden prompt is a request whose old answer the operator trusts. At temperature 0 a new
revision of the same model answers it the same way, or nearly (batching changes the order of
float sums, so a late token may flip: "similar" tolerates that); a revision that answers
otherwise, calls other tools or stops writing valid JSON is caught at its first step, before
the statistics of real traffic could show it.

Three parts: `parse_golden` checks the operator's items (pure; every error names the field and
its index), `compare` judges one pair of answers (pure), and `ask` / `run_golden` send the
requests straight to each unit's leader, bypassing routing, with the unit's own header lines
(`extra_head`: its `headers` and API key, from UnitConfig.header_lines(), as the request path
sends them), its name for the model (`served_model`) and its TLS context.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any, NamedTuple, Protocol

import aiohttp
import orjson

from gateway.config import UnitConfig
from gateway.tls import unit_context

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
PATHS = (CHAT, COMPLETIONS)
COMPARES = ("exact", "similar")
ITEM_KEYS = ("path", "body", "compare", "min_similarity")
MAX_ITEMS = 20  # sent to both revisions at every step: a few dozen requests, not a load test
# A body without max_tokens gets this many: enough to tell two answers apart, cheap to send
# at every step. At most MAX_TOKENS: the comparison's cost grows with the answers' squares.
DEFAULT_MAX_TOKENS = 64
MAX_TOKENS = 1024
DEFAULT_SIMILARITY = 0.9
MAX_ANSWER = 1 << 20  # bytes of an answer read at most
FORMATS = ("text", "json_object", "json_schema")
# What similarity counts: words, punctuation marks, and each Chinese or Japanese character
# (their scripts put no space between words: a whole sentence would otherwise be one word).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORDS = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+|[^\w\s]")


class GoldenError(ValueError):
    """The golden items are not valid; `problems` names each bad field."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class GoldenItem:
    index: int  # its place in the request's `golden` list
    path: str
    body: Mapping[str, Any] = field(hash=False)  # as sent: temperature 0, not streamed, n = 1
    compare: str = "exact"
    min_similarity: float = 1.0  # "similar" only

    @property
    def response_format(self) -> str:
        found = self.body.get("response_format")
        return str(found.get("type", "text")) if isinstance(found, Mapping) else "text"

    @property
    def schema(self) -> Mapping[str, Any] | None:
        if self.response_format != "json_schema":
            return None
        schema: Mapping[str, Any] = self.body["response_format"]["json_schema"]["schema"]
        return schema

    def payload(self, served_model: str = "") -> bytes:
        """The body as one unit is sent it: `model` is the unit's own name for it, if any."""
        return orjson.dumps({**self.body, "model": served_model or self.body.get("model")})


@dataclass(frozen=True, slots=True)
class GoldenResult:
    index: int
    passed: bool  # False when inconclusive too: check `inconclusive` first
    reason: str  # one plain sentence
    similarity: float  # of the answers' texts, 0..1 (1 = the same words)
    inconclusive: bool = False  # the old revision could not answer: no judgement either way


class GoldenUnit(Protocol):
    """What `run_golden` needs of a unit; gateway.units.UnitState is one."""

    @property
    def id(self) -> str: ...
    @property
    def leader(self) -> str: ...
    @property
    def extra_head(self) -> bytes: ...
    @property
    def config(self) -> UnitConfig: ...


# -- the operator's items ---------------------------------------------------------------------


def parse_golden(raw: object) -> list[GoldenItem]:
    """The items of a rollout request's `golden` list, or GoldenError naming every bad field."""
    if not isinstance(raw, list | tuple):
        raise GoldenError(["golden: must be a list of prompts"])
    if len(raw) > MAX_ITEMS:
        raise GoldenError([f"golden: at most {MAX_ITEMS} prompts, got {len(raw)}"])
    items: list[GoldenItem] = []
    problems: list[str] = []
    for index, entry in enumerate(raw):
        try:
            items.append(_item(index, entry))
        except GoldenError as exc:
            problems += exc.problems
    if problems:
        raise GoldenError(problems)
    return items


def _item(index: int, entry: object) -> GoldenItem:
    where = f"golden[{index}]"
    if not isinstance(entry, Mapping):
        raise GoldenError([f"{where}: must be an object"])
    problems = [
        f"{where}.{key}: unknown key (keys: {', '.join(ITEM_KEYS)})"
        for key in entry
        if key not in ITEM_KEYS
    ]
    path = entry.get("path", CHAT)
    if path not in PATHS:
        problems.append(f"{where}.path: must be {' or '.join(PATHS)}")
    compare = entry.get("compare", "exact")
    if compare not in COMPARES:
        problems.append(f"{where}.compare: must be 'exact' or 'similar'")
    least = _min_similarity(where, entry, compare, problems)
    body = _body(f"{where}.body", entry.get("body"), path, problems)
    if problems:
        raise GoldenError(problems)
    return GoldenItem(index, path, body, compare, least)


def _min_similarity(
    where: str, entry: Mapping[str, Any], compare: str, problems: list[str]
) -> float:
    if "min_similarity" not in entry:
        return DEFAULT_SIMILARITY if compare == "similar" else 1.0
    value = entry["min_similarity"]
    if compare != "similar":
        problems.append(f"{where}.min_similarity: only applies to compare 'similar'")
    elif isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        problems.append(f"{where}.min_similarity: must be a number in (0, 1], got {value!r}")
    else:
        return float(value)
    return 1.0


def _body(where: str, raw: object, path: str, problems: list[str]) -> dict[str, Any]:
    """The request as sent: checked, then forced to temperature 0, no stream, one answer."""
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: must be the request's JSON object")
        return {}
    body = dict(raw)
    if not isinstance(body.get("model"), str) or not body["model"]:
        problems.append(f"{where}.model: must name the model")
    if path == CHAT and not (isinstance(body.get("messages"), list) and body["messages"]):
        problems.append(f"{where}.messages: must be a non-empty list")
    if path == COMPLETIONS and not isinstance(body.get("prompt"), str | list):
        problems.append(f"{where}.prompt: is required (a string or a list)")
    if body.get("stream", False) is not False:
        problems.append(f"{where}.stream: must be false or absent (answers are compared whole)")
    if "stream_options" in body:
        problems.append(f"{where}.stream_options: only applies to a stream")
    n = body.get("n", 1)
    if isinstance(n, bool) or n != 1:
        problems.append(f"{where}.n: must be 1 or absent (one answer per revision), got {n!r}")
    limit = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    tokens = body.setdefault(limit, DEFAULT_MAX_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_TOKENS:
        problems.append(f"{where}.{limit}: must be a whole number in 1..{MAX_TOKENS}")
    _check_format(f"{where}.response_format", body.get("response_format"), problems)
    body.update(temperature=0, stream=False, n=1)
    return body


def _check_format(where: str, found: object, problems: list[str]) -> None:
    if found is None:
        return
    if not isinstance(found, Mapping) or found.get("type") not in FORMATS:
        problems.append(f"{where}.type: must be one of {', '.join(FORMATS)}")
        return
    if found["type"] != "json_schema":
        return
    spec = found.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, Mapping) else None
    if not isinstance(schema, Mapping):
        problems.append(f"{where}.json_schema.schema: must be a JSON schema (an object)")
        return
    checker = _jsonschema()
    if checker is not None:
        try:
            checker.validators.validator_for(schema).check_schema(schema)
        except checker.SchemaError as exc:
            problems.append(f"{where}.json_schema.schema: is not a valid schema: {exc.message}")


def _jsonschema() -> Any:
    """The jsonschema package (the test extra installs it), or None: JSON is then only parsed."""
    try:
        return importlib.import_module("jsonschema")
    except ImportError:
        return None


# -- judging two answers -----------------------------------------------------------------------


class _Reply(NamedTuple):
    text: str
    calls: list[Any]  # tool calls, [] for none


def compare(item: GoldenItem, old: Mapping[str, Any], new: Mapping[str, Any]) -> GoldenResult:
    """Judge the new revision's answer against the old one's: an error, tool calls and the
    requested JSON format first, then the texts, equal ("exact") or similar enough.

    Similarity is difflib's ratio over the answers' words and punctuation marks: the share of
    them both answers have in the same order. At temperature 0 two revisions of one model part,
    if at all, at a flipped token after which the rest differs, and the ratio counts exactly how
    much is still the same; it needs no tokenizer or embedding model the gateway does not have.
    Words, not characters: as many flips cost the same whatever the words' length, and the
    cost (quadratic at worst) stays small for MAX_TOKENS-long answers."""
    if (why := _trouble(old)) is not None:
        reason = f"Inconclusive: the old revision could not answer ({why})."
        return GoldenResult(item.index, False, reason, 0.0, inconclusive=True)
    if (why := _trouble(new)) is not None:
        return GoldenResult(item.index, False, f"The new revision could not answer ({why}).", 0.0)
    was, now = _reply(old), _reply(new)
    before, after = _comparable(item, was.text), _comparable(item, now.text)
    matcher = SequenceMatcher(None, _WORDS.findall(before), _WORDS.findall(after), False)
    ratio = matcher.ratio()
    problem = _calls_problem(item, was.calls, now.calls) or _format_problem(item, now.text)
    if problem:
        return GoldenResult(item.index, False, problem, ratio)
    passed, verdict = _texts(item, before, after, ratio)
    return GoldenResult(item.index, passed, f"{verdict}{_format_note(item)}.", ratio)


def _texts(item: GoldenItem, before: str, after: str, ratio: float) -> tuple[bool, str]:
    """Whether the texts pass, and the sentence saying so (without its full stop)."""
    if item.compare == "similar":
        passed = ratio >= item.min_similarity
        than = "at least" if passed else "below"
        return (
            passed,
            f"The answers' similarity is {ratio:.2f}, {than} the {item.min_similarity:g} asked for",
        )
    if before == after:
        return True, "The answers are the same"
    pairs = enumerate(zip(before, after, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(before), len(after)))
    return False, f"The answers differ from character {at} on (similarity {ratio:.2f})"


def _trouble(answer: Mapping[str, Any]) -> str | None:
    """Why `answer` is no answer (an error, a failure `ask` describes, no choices), or None."""
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return None
    error = answer.get("error")
    if isinstance(error, Mapping):
        error = error.get("message")
    return str(error)[:300] if error else "its answer has no choices"


def _reply(answer: Mapping[str, Any]) -> _Reply:
    choice = answer["choices"][0]
    message = choice.get("message")
    if not isinstance(message, Mapping):  # /v1/completions
        return _Reply(str(choice.get("text") or ""), [])
    calls = message.get("tool_calls")
    return _Reply(str(message.get("content") or ""), calls if isinstance(calls, list) else [])


def _comparable(item: GoldenItem, text: str) -> str:
    """JSON answers (response_format) compare as values, not as their spacing."""
    if item.response_format == "text":
        return text
    try:
        return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONDecodeError:
        return text


def _calls_problem(item: GoldenItem, old: list[Any], new: list[Any]) -> str | None:
    if not old:
        if new:
            return f"The new revision called {_names(new)} where the old one answered in text."
        return None
    if not new:
        return f"The old revision called {_names(old)}; the new one called no tool."
    if _names(old) != _names(new):
        return f"The new revision called {_names(new)} where the old one called {_names(old)}."
    for number, (was, now) in enumerate(zip(old, new, strict=True)):
        arguments = _arguments(now)
        if arguments is None:
            return f"The new revision's call {number} has arguments that are not a JSON object."
        if item.compare == "exact" and arguments != _arguments(was):
            return f"The new revision's call {number} has other arguments than the old one's."
    return None


def _names(calls: list[Any]) -> list[str]:
    functions = (c.get("function") if isinstance(c, Mapping) else None for c in calls)
    return [str(f.get("name")) if isinstance(f, Mapping) else "?" for f in functions]


def _arguments(call: Any) -> dict[str, Any] | None:
    """A call's arguments as a JSON object (servers send them as a JSON string), or None."""
    function = call.get("function") if isinstance(call, Mapping) else None
    arguments = function.get("arguments") if isinstance(function, Mapping) else None
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return None
    return arguments if isinstance(arguments, dict) else None


def _format_problem(item: GoldenItem, text: str) -> str | None:
    if item.response_format == "text":
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        wanted = item.response_format
        return f"The new revision's answer is not JSON, though response_format asks for {wanted}."
    schema = item.schema
    checker = _jsonschema() if schema is not None else None
    if checker is None:
        return None
    validator = checker.validators.validator_for(schema)(schema)
    error = checker.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    return f"The new revision's answer does not match its schema: {error.message}."


def _format_note(item: GoldenItem) -> str:
    if item.schema is not None and _jsonschema() is None:
        return (
            " (the new answer was parsed as JSON but not checked against its schema: "
            "jsonschema is not installed)"
        )
    return ""


# -- asking the units --------------------------------------------------------------------------


async def ask(
    session: aiohttp.ClientSession,
    leader: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    within: float,
    *,
    tls: ssl.SSLContext | None = None,
) -> dict[str, Any]:
    """POST `body` to `leader` + `path`, in at most `within` seconds: the answer's JSON
    object, or {"status": HTTP status or None, "error": "one sentence"} for any failure (never
    raises for one: HTTP, network, timeout, a body that is not a JSON object or is too big)."""
    url = leader.rstrip("/") + path
    sent = {**headers, "Content-Type": "application/json"}
    status: int | None = None
    try:
        async with (
            asyncio.timeout(within),
            session.post(url, data=body, headers=sent, ssl=tls or True) as answer,
        ):
            status = answer.status
            raw = await _read(answer)
    except TimeoutError:
        return _failure(status, f"no answer within {within:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        return _failure(status, f"it could not be reached: {exc or type(exc).__name__}")
    if raw is None:
        return _failure(status, f"its answer is over {MAX_ANSWER} bytes")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if status is None or not 200 <= status < 300:
        return _failure(status, f"it answered {status}{_said(data)}")
    if not isinstance(data, dict):
        return _failure(status, f"it answered {status} with a body that is not a JSON object")
    return data


async def _read(answer: aiohttp.ClientResponse) -> bytes | None:
    """The whole body, or None once it passes MAX_ANSWER."""
    raw = bytearray()
    async for chunk in answer.content.iter_chunked(65536):
        raw += chunk
        if len(raw) > MAX_ANSWER:
            return None
    return bytes(raw)


def _failure(status: int | None, error: str) -> dict[str, Any]:
    return {"status": status, "error": error}


def _said(data: object) -> str:
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    return f": {str(message)[:200]}" if message else ""


def headers_of(extra_head: bytes) -> dict[str, str]:
    """A unit's header lines (UnitConfig.header_lines(), kept as UnitState.extra_head) as the
    mapping an HTTP client takes."""
    found = {}
    for line in extra_head.decode("latin-1").split("\r\n"):
        name, colon, value = line.partition(":")
        if colon:
            found[name.strip()] = value.strip()
    return found


async def run_golden(
    items: Sequence[GoldenItem],
    old_unit: GoldenUnit,
    new_unit: GoldenUnit,
    session: aiohttp.ClientSession,
    *,
    within: float = 30.0,
    concurrency: int = 4,
) -> list[GoldenResult]:
    """Ask both units every item (the two at once, at most `concurrency` items at a time, each
    request in at most `within` seconds) and judge each pair; results in the items' order."""
    bound = asyncio.Semaphore(concurrency)

    async def judge(item: GoldenItem) -> GoldenResult:
        async with bound, asyncio.TaskGroup() as group:
            was = group.create_task(_ask_unit(session, old_unit, item, within))
            now = group.create_task(_ask_unit(session, new_unit, item, within))
        return compare(item, was.result(), now.result())

    async with asyncio.TaskGroup() as group:
        judged = [group.create_task(judge(item)) for item in items]
    return [task.result() for task in judged]


async def _ask_unit(
    session: aiohttp.ClientSession, unit: GoldenUnit, item: GoldenItem, within: float
) -> dict[str, Any]:
    body = item.payload(unit.config.served_model)
    headers = headers_of(unit.extra_head)
    return await ask(
        session, unit.leader, item.path, body, headers, within, tls=unit_context(unit.config)
    )
