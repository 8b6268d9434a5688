"""The step message of a pipelined unit: sent by the leader to each follower, not broadcast.

The wire format is `messages`' (one frame, and a body after it only when it overflows the
frame). What differs is the transport: a Gloo broadcast returns only once every rank has
joined it, so a leader broadcasting step n+1 would wait for the last stage to finish step n
and no two stages could ever work at once. Here the leader `isend`s the frame to every
follower and goes on; each follower receives its frames in order from rank 0. A failed send
(a follower died) raises on one of the leader's next sends, and a follower waiting for a
frame that does not come raises when Gloo's timeout passes, as with the broadcast; the
leader's HEARTBEAT keeps an idle unit's followers from timing out. An idle leader first
waits for everything it sent before (Gloo's timeout bounds it), so a follower that hangs
while the unit is idle is found within a timeout, as a broadcast finds it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.model.pipeline import Sender
from engine.runtime.messages import FRAME_SIZE, Command, StepMessage, frames, read_frame

STEP_TAG = 10


class Unicast:
    """The leader's end, a `messages.Send`: one frame per follower, sent without waiting."""

    def __init__(self, world_size: int, sender: Sender | None = None) -> None:
        self._followers = range(1, world_size)
        self._sender = sender or Sender()

    def __call__(self, msg: StepMessage, group: dist.ProcessGroup | None = None) -> None:
        if msg.command is Command.HEARTBEAT:
            self._sender.drain()
        frame, body = frames(msg)
        for rank in self._followers:
            self._sender.send(frame, rank, STEP_TAG)
            if body is not None:
                self._sender.send(body, rank, STEP_TAG)


class UnicastReceiver:
    """A follower's end, a `messages.Receive`: the next frame from rank 0, in order.

    Each frame's receive is posted as soon as the one before is in, so it waits while the
    follower computes. Gloo moves a message only once its receive is posted; a receive posted
    after the leader's send costs a wake-up of the leader's transport thread while the
    leader computes, which measured up to a few ms a step. A body (a message that overflows
    its frame) is received before the next frame's receive is posted, as both carry the
    same tag and Gloo matches receives in the order they were posted. No receive is left
    posted after STOP.
    """

    def __init__(self) -> None:
        self._next: tuple[dist.Work, torch.Tensor] | None = None

    def __call__(self, group: dist.ProcessGroup | None = None) -> StepMessage:
        work, frame = self._next or _post_frame()
        self._next = None
        work.wait()
        msg = read_frame(frame, lambda body: dist.recv(body, 0, tag=STEP_TAG))
        if msg.command is not Command.STOP:
            self._next = _post_frame()
        return msg


def _post_frame() -> tuple[dist.Work, torch.Tensor]:
    frame = torch.empty(FRAME_SIZE, dtype=torch.int64)
    work = dist.irecv(frame, 0, tag=STEP_TAG)
    assert work is not None  # every rank of the unit is in the world group
    return work, frame
