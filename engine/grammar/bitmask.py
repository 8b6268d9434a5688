"""llguidance's token bitmask, as torch: row r, word w, bit b allows token 32 * w + b.

The sampler applies it to logits (`engine.sampling.mask`); here it is packed and read back.
Bits are unpacked by numpy: a third of torch's shift-and-mask time, no intra-op thread pool.
"""

from __future__ import annotations

import numpy as np
import torch


def unpack_bits(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(batch, words) int32 on CPU -> (batch, vocab_size) bool, True where allowed."""
    raw = np.unpackbits(
        bitmask.contiguous().numpy().view(np.uint8), axis=-1, count=vocab_size, bitorder="little"
    )
    return torch.from_numpy(raw.view(np.bool_))
