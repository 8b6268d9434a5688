"""engine.api.Engine over vLLM's AsyncLLM, running in the leader's own event loop.

The project's leader server does the HTTP, the OpenAI JSON and the tokenization (chat template
included), exactly as for the builtin engine, and hands vLLM token ids; vLLM does the scheduling,
the model, sampling, stop handling and detokenization. So a client sees the same API, SSE and
`return_token_ids` whichever backend a unit runs.

AsyncLLM must be created and used on one event loop (its output handler is a task there), so
everything here runs on the server's loop; `abort` only schedules vLLM's abort on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from vllm import SamplingParams as VllmSamplingParams
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError

from engine.api import GenerationRequest, TokenEvent, TokenOutOfVocab
from engine.model.tokenizer import Tokenizer
from engine.runtime.group import first_line
from engine.runtime.health import NodeStats
from engine.scheduler import SamplingParams


class VllmEngine:
    def __init__(
        self, llm: Any, tokenizer: Tokenizer, name: str, stats: NodeStats, max_seq_len: int
    ) -> None:
        self._llm, self._tokenizer, self._name = llm, tokenizer, name
        self.stats, self._max_seq_len = stats, max_seq_len
        self._live: set[str] = set()
        self._aborts: set[asyncio.Task[None]] = set()

    # -- engine.api.Engine --

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    @property
    def pending(self) -> int:
        """Requests between generate() and their final event: what a stall check weighs."""
        return len(self._live)

    def health(self) -> dict[str, Any]:
        if self._llm.errored:
            self.fail(f"vLLM engine dead: {first_line(self._llm.dead_error)}")
        return self.stats.snapshot()

    def fail(self, reason: str) -> None:
        self.stats.mark_unhealthy(reason)

    def abort(self, request_id: str) -> None:
        """Scheduled, not awaited: the server calls this from sync code on the same loop."""
        if request_id not in self._live:
            return
        task = asyncio.get_running_loop().create_task(self._llm.abort(request_id))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        self._validate(request)
        failure = self.stats.failure
        if failure is not None:
            yield _final(request, 0, "error", f"engine unhealthy: {failure}")
            return
        self._live.add(request.request_id)
        self._publish_pending()
        completion = 0
        try:
            prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
            params = self._sampling(request.params)
            async for out in self._llm.generate(prompt, params, request.request_id):
                for event in _events(request, out, completion):
                    completion = event.completion_tokens
                    yield event
        except VLLMClientError as exc:
            raise ValueError(str(exc)) from None
        except EngineDeadError as exc:
            self.fail(f"vLLM engine dead: {first_line(exc)}")
            yield _final(request, completion, "error", f"engine unhealthy: {first_line(exc)}")
        except Exception as exc:  # vLLM's EngineGenerateError and kin: this request only
            yield _final(request, completion, "error", first_line(exc))
        finally:
            self._live.discard(request.request_id)
            self._publish_pending()

    def _publish_pending(self) -> None:
        """`pending` changes here; the running count is the step counter's (vLLM's own)."""
        self.stats.set_load(self.pending, self.stats.snapshot()["kv_slots_used"])

    def _validate(self, request: GenerationRequest) -> None:
        """Refuse in the caller's task what vLLM would reject, with the builtin's messages."""
        ids = request.prompt_ids
        if not ids:
            raise ValueError("prompt_ids: must hold at least one token")
        if len(ids) > self.max_seq_len - 1:
            raise ValueError(f"prompt_ids: {len(ids)} tokens, at most {self.max_seq_len - 1} fit")
        # The model's vocabulary, which may be padded past the tokenizer's: a resumed stream
        # sends back every id the model generated.
        vocab = int(self._llm.model_config.get_vocab_size())
        for token in (min(ids), max(ids)):
            if not 0 <= token < vocab:
                raise TokenOutOfVocab(token, vocab)

    def _sampling(self, params: SamplingParams) -> Any:
        """Our params in vLLM's terms. The tokenizer's end-of-turn ids stop generation as they do
        on the builtin engine; vLLM itself only knows the model's EOS."""
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops |= self._tokenizer.stop_ids
        return VllmSamplingParams(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stop=list(params.stop) or None,
            stop_token_ids=sorted(stops),
            ignore_eos=params.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
        )


def _events(request: GenerationRequest, out: Any, completion: int) -> list[TokenEvent]:
    """One vLLM delta -> one event per new token; the text rides on the last one, and a delta
    without tokens (an abort, a stop string cut) still carries the ending."""
    choice = out.outputs[0]
    ids = list(choice.token_ids)
    reason = choice.finish_reason if out.finished else None
    prompt = len(request.prompt_ids)
    if not ids:
        return [_event(request, None, choice.text, out.finished, reason, prompt, completion)]
    events = []
    for i, token in enumerate(ids, start=1):
        last = i == len(ids)
        text = choice.text if last else ""
        finished = out.finished and last
        events.append(
            _event(request, token, text, finished, reason if last else None, prompt, completion + i)
        )
    return events


def _event(
    request: GenerationRequest,
    token: int | None,
    text: str,
    finished: bool,
    reason: str | None,
    prompt: int,
    completion: int,
) -> TokenEvent:
    return TokenEvent(
        request_id=request.request_id,
        token_id=token,
        text=text,
        finished=finished,
        finish_reason=str(reason) if reason is not None else None,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def _final(request: GenerationRequest, completion: int, reason: str, error: str) -> TokenEvent:
    return TokenEvent(
        request_id=request.request_id,
        token_id=None,
        text="",
        finished=True,
        finish_reason=reason,
        prompt_tokens=len(request.prompt_ids),
        completion_tokens=completion,
        error=error,
    )
