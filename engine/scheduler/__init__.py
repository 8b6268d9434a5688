"""Continuous batching for the unit engine: which sequences run in each step, and when they end.

Pure bookkeeping (no torch, no I/O), so it is tested in milliseconds and reused by any runner.
"""

from engine.prefixcache import BlockCopy, TableEdit
from engine.scheduler.batch import ScheduledBatch, ScheduledSeq
from engine.scheduler.config import DEFAULT_PREFILL_CHUNK, SchedulerConfig
from engine.scheduler.errors import (
    DuplicateSequence,
    EmptyPrompt,
    FieldError,
    GroupTooLarge,
    InvalidConfig,
    InvalidParams,
    PromptTooLong,
    RequestRejected,
    SchedulerError,
    UnknownSequence,
)
from engine.scheduler.scheduler import Scheduler
from engine.scheduler.sequence import FinishReason, SamplingParams, Sequence, SequenceStatus
from engine.scheduler.stops import find_stop, partial_stop_len

__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "BlockCopy",
    "DuplicateSequence",
    "EmptyPrompt",
    "FieldError",
    "FinishReason",
    "GroupTooLarge",
    "InvalidConfig",
    "InvalidParams",
    "PromptTooLong",
    "RequestRejected",
    "SamplingParams",
    "ScheduledBatch",
    "ScheduledSeq",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "Sequence",
    "SequenceStatus",
    "TableEdit",
    "UnknownSequence",
    "find_stop",
    "partial_stop_len",
]
