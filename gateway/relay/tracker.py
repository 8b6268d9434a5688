"""One resumable stream, followed event by event on its way to the client.

The tracker sits between a unit's SSE bytes and the client. It records what resumption needs
(the prompt token ids, the generated ids whose text the client already has, how the answer
ended), hides what the client did not ask for (the token ids the gateway requested for its own
use, and the chunks that exist only to carry them), and, once a stream has been continued on
another unit, rewrites that unit's text-completion chunks into the original answer's shape:
same `id`, `created` and `model`, no second role delta, usage counting the whole answer once.

Token ids are kept as the unit sent them, its digits appended to one byte buffer, and parsed
only when a resumption (or a test) asks for them: most streams never break, and turning every
event's ids into ints cost more than any other line of the per-event path (py-spy, 20 ms ITL);
a buffer holds a token in about 6 bytes where a list of slices took about 45.

"Committed" tokens are those whose text reached the client. A token whose text an engine
still holds back (half of a UTF-8 character, a possible stop-string prefix) is not committed:
the continuation generates it again, so the client never sees a character twice or a
character cut in half.
"""

from __future__ import annotations

from array import array
from typing import Any

import orjson

from gateway.relay.sse import TOO_LONG, EventSplitter, data_of
from gateway.relay.usage import cached_of

_TEMPLATE_KEYS = ("id", "object", "created", "model", "system_fingerprint")
_IDS = b',"token_ids":['
_IDS_LEN = len(_IDS)
_NULL_FINISH = b'"finish_reason":null'
_NULL_FINISH_LEN = len(_NULL_FINISH)
_FINISH = b'"finish_reason":"'
_FINISH_LEN = len(_FINISH)
# vLLM's chunks may put these between the finish reason and the ids: a null stop_reason (kept,
# as the parsing path keeps it) and, in completion chunks, null prompt ids (which go with the
# ids: the parsing path deletes both keys).
_STOP_NULL = b',"stop_reason":null'
_STOP_NULL_LEN = len(_STOP_NULL)
_VLLM_PROMPT = b',"prompt_token_ids":null'
_VLLM_PROMPT_LEN = len(_VLLM_PROMPT)
_ENDINGS = (b"}]}\n\n", b'}],"usage":null}\n\n')
_TEXT = {True: b'"delta":{"content":"', False: b'"text":"'}
_EMPTY_DELTA = b'"delta":{}'
_QUOTE = ord('"')
_DONE = b"data: [DONE]\n\n"
# The last chunk of an answer whose client asked for usage: no choices, nothing to strip.
_CHOICES = b'"choices"'
_NO_CHOICES = b'"choices":[]'
_USAGE_OBJECT = b'"usage":{'
_NOT_IN_USAGE_CHUNK = (b'"error"', b'token_ids"')


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class StreamTracker:
    __slots__ = (
        "base",
        "cached",
        "capable",
        "chat",
        "client_ids",
        "committed",
        "continuing",
        "done",
        "error",
        "finish_reason",
        "ids",
        "include_usage",
        "produced",
        "prompt_ids",
        "reads_usage",
        "resent",
        "resumes",
        "splitter",
        "template",
        "unparsed",
    )

    def __init__(
        self, chat: bool, client_ids: bool, include_usage: bool, reads_usage: bool = False
    ) -> None:
        self.chat = chat
        self.client_ids = client_ids  # the client asked for token ids itself
        self.include_usage = include_usage  # the client asked for usage
        # The gateway reads the unit's usage chunk (it asked for it: the client then does not
        # see it unless it asked too), for the prompt tokens the unit's cache held.
        self.reads_usage = reads_usage
        self.cached: int | None = None  # as the unit's usage said, once read
        self.splitter = EventSplitter()
        # The prompt's ids as 32-bit integers: a list of int objects takes 36 bytes a token,
        # 72 KB for a 2,000-token prompt held for the stream's whole life; this takes 4.
        self.prompt_ids: array[int] | None = None
        # The generated ids: `ids` parsed, then `unparsed` (the units' own digits, each list
        # followed by a comma, in order) still to parse; `produced` counts both.
        self.ids: list[int] = []
        self.unparsed = bytearray()
        self.produced = 0
        self.committed = 0
        self.base = 0  # committed tokens the current continuation was given as its prompt
        # Ids a client that asked for them already has past the committed ones: the
        # continuation generates those tokens again, and they are not shown twice.
        self.resent = 0
        self.continuing = False
        self.resumes = 0
        self.capable: bool | None = None  # did the unit return token ids? None: no event yet
        self.template: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.done = False  # [DONE] relayed
        self.error: str | None = None  # an error event the unit sent instead of the rest

    @property
    def generated(self) -> list[int]:
        """Every generated token id so far, in order (parsed now if not yet)."""
        if self.unparsed:
            self.ids.extend(map(int, self.unparsed[:-1].split(b",")))
            self.unparsed.clear()
        return self.ids

    def _extend(self, ids: list[int]) -> None:
        if not ids:
            return
        if self.unparsed:  # after what is still unparsed, in order, without parsing it
            self.unparsed += b"".join(b"%d," % i for i in ids)
        else:
            self.ids.extend(ids)
        self.produced += len(ids)

    # -- the stream --------------------------------------------------------------------------

    def feed(self, data: bytes) -> bytes:
        """The bytes to send the client for `data` read from the unit (whole events only).

        gateway/relay/native/relay.c does the same (the splitting, `_known_shape`, [DONE], and
        `_original` for a first event as the servers write it) in C and calls `_event` for
        the rest: the two must stay alike, byte for byte."""
        # The common read: one whole token chunk, taken as `_event` would take it.
        if (
            self.capable
            and not self.continuing
            and not self.splitter.pending
            and not self.done
            and self.error is None
            and data.startswith(b"data: {")
            and data.find(b"\n\n") == len(data) - 2
            and b"\n\r\n" not in data
        ):
            fast = self._known_shape(data)
            if fast is not None:
                return fast
        out = b"".join([self._event(event) for event in self.splitter.feed(data)])
        if self.splitter.overflowed():
            self.error = TOO_LONG
        return out

    def _event(self, event: bytes) -> bytes:
        if self.done or self.error is not None:
            return b""  # nothing follows the end, or an error the gateway will handle
        if self.capable and not self.continuing and event.startswith(b"data: {"):
            fast = self._known_shape(event)
            if fast is not None:
                return fast
        payload = data_of(event)
        if payload is None:
            return b"" if self.continuing else event  # comments / keep-alives
        if payload.strip() == b"[DONE]":
            self.done = True
            return _DONE
        if self.capable is False:
            return event  # a unit without token ids: relayed as it is, never resumed
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            if self.continuing:
                self.error = "the unit sent an event that is not a JSON object"
                return b""
            self.capable = False  # not an OpenAI stream: the gateway only relays it
            return event
        if "error" in obj and not obj.get("choices"):
            error = obj["error"]
            message = error.get("message") if isinstance(error, dict) else error
            self.error = str(message or "the unit reported an error")
            return b""
        return self._continued(obj) if self.continuing else self._original(obj, event)

    def _known_shape(self, event: bytes) -> bytes | None:
        """The common events, read and stripped without parsing the JSON (a parse and a
        re-serialisation cost as much as relaying the event): one choice's token chunk, its
        finish chunk, and the usage chunk after it. Anything else (another key order, a
        second choice, an error) returns None and takes the parsing path; what this returns,
        and leaves in the tracker, is what that path would (byte for byte on compact JSON:
        the builtin engine's, the simulated units', vLLM's)."""
        start = event.rfind(_IDS)  # near the end: scanning from there is shorter
        if start < 0:
            return event if not self.reads_usage and _is_usage_chunk(event) else None
        # What sits before the ids: the finish reason (null, or a plain word), then perhaps
        # vLLM's null stop_reason, then perhaps its null prompt ids.
        cut = at = start  # `cut`: where what the client does not see begins
        if event[at - _VLLM_PROMPT_LEN : at] == _VLLM_PROMPT:
            cut = at = at - _VLLM_PROMPT_LEN
        if event[at - _STOP_NULL_LEN : at] == _STOP_NULL:
            at -= _STOP_NULL_LEN
        finish: str | None = None
        if event[at - _NULL_FINISH_LEN : at] != _NULL_FINISH:
            finish = _finish_before(event, at)
            if finish is None:
                return None
        end = event.find(b"]", start + _IDS_LEN)
        if end < 0 or event[end + 1 :] not in _ENDINGS or event.count(_IDS) != 1:
            return None
        text_at = event.find(_TEXT[self.chat])
        if text_at >= 0:
            has_text = event[text_at + len(_TEXT[self.chat])] != _QUOTE
        elif finish is not None and self.chat and _EMPTY_DELTA in event:
            has_text = False  # a chat finish chunk's empty delta
        else:
            return None
        listed = event[start + _IDS_LEN : end]
        if listed:
            self.unparsed += listed
            self.unparsed += b","
            self.produced += listed.count(b",") + 1
        if has_text:
            self.committed = self.produced
        if finish is not None:
            self.finish_reason = finish
        if self.client_ids:
            return event
        if not has_text and finish is None:
            return b""  # a chunk that only carried token ids the client did not ask for
        return event[:cut] + event[end + 1 :]

    def _original(self, obj: dict[str, Any], event: bytes) -> bytes:
        if not self.template:
            self.template = {k: obj[k] for k in _TEMPLATE_KEYS if k in obj}
        choices = obj.get("choices") or []
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        if self.capable is None:
            self.prompt_ids = _packed(
                _ids(obj.get("prompt_token_ids", first.get("prompt_token_ids")))
            )
            self.capable = self.prompt_ids is not None
        changed = False
        if not self.client_ids and "prompt_token_ids" in obj:
            del obj["prompt_token_ids"]
            changed = True
        if not first:
            usage = obj.get("usage")
            if isinstance(usage, dict) and not choices:
                self.cached = cached_of(usage)
                if self.reads_usage and not self.include_usage:
                    return b""  # asked for by the gateway, not by the client
            return sse(obj) if changed else event
        self._extend(_ids(first.get("token_ids")) or [])
        text = _text(first, self.chat)
        if text:
            self.committed = self.produced
        if first.get("finish_reason"):
            self.finish_reason = first["finish_reason"]
        if self.client_ids or not self.capable:
            return sse(obj) if changed else event
        for key in ("token_ids", "prompt_token_ids"):
            if key in first:
                del first[key]
                changed = True
        if not text and not first.get("finish_reason") and not _is_opening(first):
            return b""  # a chunk that only carried token ids the client did not ask for
        return sse(obj) if changed else event

    def _continued(self, obj: dict[str, Any]) -> bytes:
        choices = obj.get("choices") or []
        if not choices:
            usage = obj.get("usage")
            if isinstance(usage, dict) and self.include_usage:
                return self._usage_chunk(_int(usage.get("completion_tokens")) + self.base)
            return b""
        first = choices[0] if isinstance(choices[0], dict) else {}
        ids = _ids(first.get("token_ids")) or []
        self._extend(ids)
        if self.resent:
            shown, self.resent = (
                min(self.resent, len(ids)),
                self.resent - min(self.resent, len(ids)),
            )
            ids = ids[shown:]
        text = first.get("text") or ""
        if text:
            self.committed = self.produced
        finish = first.get("finish_reason")
        if finish:
            self.finish_reason = finish
        if not text and not finish and not self.client_ids:
            return b""
        return sse(self._chunk(text, finish, ids))

    def _chunk(self, text: str, finish: str | None, ids: list[int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["delta"] = {"content": text} if text or not finish else {}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        if self.client_ids:
            choice["token_ids"] = ids
        chunk = {**self.template, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def _usage_chunk(self, completion: int) -> bytes:
        prompt = len(self.prompt_ids or ())
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        return sse({**self.template, "choices": [], "usage": usage})

    # -- resumption ---------------------------------------------------------------------------

    def resume_point(self) -> list[int] | None:
        """The continuation's prompt (prompt ids + committed ids), None if the unit gave none
        (or, parsed only now, ids that are not integers: nothing to resume from)."""
        if self.prompt_ids is None:
            return None
        try:
            generated = self.generated
        except ValueError:
            self.unparsed.clear()
            self.prompt_ids = None
            return None
        return self.prompt_ids.tolist() + generated[: self.committed]

    def begin_continuation(self) -> None:
        """Forget what the broken unit sent past the last committed token; rewrite from now."""
        self.splitter.discard()
        if self.client_ids:
            self.resent += self.produced - self.committed
        del self.generated[self.committed :]
        self.produced = self.committed
        self.base = self.committed
        self.continuing = True
        self.error = None
        self.finish_reason = None
        self.resumes += 1

    def closing(self, finish_reason: str | None = None) -> bytes:
        """The end of an answer that needs no more tokens: the finish chunk (unless relayed
        already), the usage chunk when asked for, and [DONE]."""
        out = b""
        if finish_reason is not None and self.finish_reason is None:
            self.finish_reason = finish_reason
            out += sse(self._chunk("", finish_reason, []))
        if self.include_usage:
            out += self._usage_chunk(self.produced)
        self.done = True
        return out + _DONE


def _finish_before(event: bytes, at: int) -> str | None:
    """The finish reason that ends just before `at`, when it is a plain word of at most 32
    lowercase letters and underscores (`stop`, `length`, `tool_calls`), else None."""
    if event[at - 1 : at] != b'"':
        return None
    word = at - 1
    while word > at - 33 and (97 <= event[word - 1] <= 122 or event[word - 1] == 95):
        word -= 1
    if word == at - 1 or event[word - _FINISH_LEN : word] != _FINISH:
        return None
    return event[word : at - 1].decode()


def _is_usage_chunk(event: bytes) -> bool:
    """Whether `event` is an answer's usage chunk as the units send it: no choices, a usage
    object, no ids to strip, no error (the parsing path would return it as it is)."""
    return (
        event.count(_CHOICES) == 1
        and _NO_CHOICES in event
        and _USAGE_OBJECT in event
        and not any(word in event for word in _NOT_IN_USAGE_CHUNK)
    )


def _ids(value: object) -> list[int] | None:
    """`value` when it is a list of token ids (ints), else None."""
    if isinstance(value, list) and all(type(t) is int for t in value):
        return value
    return None


def _packed(ids: list[int] | None) -> array[int] | None:
    """`ids` as 32-bit integers; None if there are none, or one does not fit (no tokenizer
    has 2**31 tokens: the unit's ids are not usable, as ids that are not integers)."""
    if ids is None:
        return None
    try:
        return array("i", ids)
    except OverflowError:
        return None


def _text(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        delta = choice.get("delta")
        return (delta.get("content") or "") if isinstance(delta, dict) else ""
    return choice.get("text") or ""


def _is_opening(choice: dict[str, Any]) -> bool:
    delta = choice.get("delta")
    return isinstance(delta, dict) and "role" in delta


def _int(value: object) -> int:
    return value if type(value) is int else 0
