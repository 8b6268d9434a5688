"""What the runtime steps: a whole `Transformer` on a tensor-parallel rank, or a
`PipelineStage` on a rank of a pipelined unit. Both take a step's batch and return the
logits (a pipeline's followers: an empty tensor), and own the rank's KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.model import KVCache, ModelConfig, TPContext
from engine.model.transformer import Entry


class StepModel(Protocol):
    @property
    def config(self) -> ModelConfig: ...

    @property
    def cache(self) -> KVCache: ...

    @property
    def tp(self) -> TPContext:
        """The unit's group as the step messages travel it (rank 0 is the leader)."""
        ...

    @property
    def layers_run(self) -> int:
        """Layers this rank has run since it started: a node's `progress` on /health."""
        ...

    def __call__(self, batch: Sequence[Entry]) -> torch.Tensor: ...
