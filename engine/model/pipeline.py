"""One pipeline stage on one rank: its part of the model and the hand-overs around it.

Every rank of a `tp x pp` unit gets each step's batch (the step message); a stage then runs
its layers on the activations the stage before it sends, and sends its own on:

    stage 0:  embed -> its layers -> send (tokens, hidden) to stage 1
    stage k:  receive from stage k-1 -> its layers -> send to stage k+1
    last:     receive -> its layers -> each entry's last token, (entries, hidden), to rank 0
    rank 0:   receive those -> final norm and LM head -> logits, sampled as without a pipeline

Each rank of a stage pairs with the rank at the same place in the next stage (every rank of
a stage holds the whole hidden state after its all-reduces), so the hand-overs of a
`tp 2 x pp 2` unit run two at a time. Shapes need no header: the step message tells every
rank the batch's token count.

Sends are `isend`s whose buffers are kept until they complete, so a stage never waits for
the next one to be ready to receive: only receives block (Gloo's timeout bounds them, and a
dead peer's closed connection ends them at once). The leader can therefore start a step
into stage 0 while the stages after it still run earlier ones (`start`, then `finish` in
the same order): `engine.runtime.pipelined` keeps `pp` micro-batches of sequences in flight.

float16 weights (`engine.model.narrow`) run widened here: `Transformer.forward`'s retry of
an overflowing step would need every stage to run it again, so a stage never risks one.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence

import torch
import torch.distributed as dist

from engine.model import narrow
from engine.model.parallel import TPContext
from engine.model.stages import Layout
from engine.model.transformer import Entry, Transformer

FORWARD_TAG = 11  # activations from a stage to the next
BACK_TAG = 12  # the last stage's hidden states of each entry's last token, to rank 0
# Sends in flight before the oldest is waited for: a few steps of every hand-over.
MAX_IN_FLIGHT = 16


class Sender:
    """`isend`s whose tensors live until they complete; a failed one raises on a later call."""

    def __init__(self) -> None:
        self._flying: deque[tuple[dist.Work, torch.Tensor]] = deque()

    def send(self, x: torch.Tensor, dst: int, tag: int) -> None:
        x = x.contiguous()
        work = dist.isend(x, dst, tag=tag)
        assert work is not None  # every rank of the unit is in the world group
        self._flying.append((work, x))
        self.reap()

    def reap(self) -> None:
        """Forget completed sends (raising for a failed one); wait for the oldest while
        more than MAX_IN_FLIGHT are out."""
        while self._flying and (
            len(self._flying) > MAX_IN_FLIGHT or self._flying[0][0].is_completed()
        ):
            work, _ = self._flying.popleft()
            work.wait()

    def drain(self) -> None:
        while self._flying:
            work, _ = self._flying.popleft()
            work.wait()


class PipelineStage:
    """The runtime's model on a rank of a pipelined unit: called with a step's batch as a
    `Transformer` is; rank 0 gets the logits, the other ranks an empty tensor."""

    def __init__(self, model: Transformer, layout: Layout) -> None:
        self.model, self.layout = model, layout
        self.config, self.cache = model.config, model.cache
        # The unit's view for the runtime (step messages, logs): this rank in the world.
        self.tp = TPContext(rank=layout.rank, world_size=layout.world_size)
        self.sender = Sender()
        # rank 0: each step in flight's hand-back, its receive posted when the step started
        self._started: deque[tuple[dist.Work, torch.Tensor]] = deque()

    @property
    def layers_run(self) -> int:
        """This stage's layers run since it started (`Transformer.layers_run`)."""
        return self.model.layers_run

    def __call__(self, batch: Sequence[Entry]) -> torch.Tensor:
        self.start(batch)
        return self.finish()

    def start(self, batch: Sequence[Entry]) -> None:
        """This stage's share of a step, up to its hand-over (sent, not waited for)."""
        model, layout = self.model, self.layout
        ids, positions = model.pack(batch)
        with self._arithmetic():
            if layout.is_first:
                x = model.embed(ids)
            else:
                x = self._receive(ids.shape[0], layout.previous, FORWARD_TAG)
            x = model.run_layers(x, batch, positions)
        if not layout.is_last:
            self.sender.send(x, layout.next, FORWARD_TAG)
        elif layout.returns:
            self.sender.send(model.last_tokens(x, batch), 0, BACK_TAG)
        if model.part.head:
            self._started.append(self._post_back(len(batch)))

    def finish(self) -> torch.Tensor:
        """Rank 0: the oldest started step's logits, once the last stage sends its hidden
        states back (the other ranks: an empty tensor)."""
        if not self._started:
            return torch.empty(0)
        work, x = self._started.popleft()
        work.wait()
        with self._arithmetic():
            return self.model.head(x)

    def _post_back(self, rows: int) -> tuple[dist.Work, torch.Tensor]:
        x = self._hidden(rows)
        last = self.layout.world_size - self.layout.tp  # the last stage's first rank
        work = dist.irecv(x, last, tag=BACK_TAG)
        assert work is not None  # every rank of the unit is in the world group
        return work, x

    def _receive(self, rows: int, src: int, tag: int) -> torch.Tensor:
        x = self._hidden(rows)
        dist.recv(x, src, tag=tag)
        return x

    def _hidden(self, rows: int) -> torch.Tensor:
        """A buffer for `rows` hidden states, as a hand-over carries them."""
        return torch.empty(rows, self.config.hidden_size, dtype=self.model.dtype)

    def _arithmetic(self) -> contextlib.AbstractContextManager[None]:
        return narrow.widened() if self.model.narrow else contextlib.nullcontext()
