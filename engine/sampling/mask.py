"""Grammar masks: llguidance's packed token bitmask applied to a batch of logits.

The bitmask is int32 of shape (B, ceil(n/32)): bit j of word i set means token 32*i + j is
allowed; a row without a grammar has every bit set (-1). Disallowed tokens become -inf.

Unpacked with plain torch rather than `llguidance.torch.apply_token_bitmask_inplace`: that
one is torch.compile'd, 15 s on its first call (2 s more for each new shape class, and it
needs a C++ compiler at run time) to save about 50 us per call (~55 against ~105-145 us on a
batch of 8 x 49152, 2 CPUs). Branch-free: `masked_fill_` and `torch.where` take ~1 ms on
a mask of random bits.
"""

from __future__ import annotations

import torch

# Bit j of a word; bit 31 is the sign bit of an int32.
_BITS = torch.tensor([1 << j for j in range(31)] + [-(1 << 31)], dtype=torch.int32)
# The int32 whose float32 bits are -inf: 0 * it is 0.0, 1 * it is -inf, without a branch.
_NEG_INF_BITS = int(torch.tensor(float("-inf")).view(torch.int32))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set disallowed tokens of the (B, V) `logits` to -inf, in place.

    A bitmask wider than V has its extra bits ignored; tokens past a narrower one (the
    model's vocabulary may be larger than the tokenizer's) are disallowed.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    rows, vocab = logits.shape
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[0] != rows:
        raise ValueError(
            f"bitmask must be int32 of shape ({rows}, words), "
            f"got {bitmask.dtype} of shape {tuple(bitmask.shape)}"
        )
    covered = min(vocab, 32 * bitmask.shape[1])
    words = (covered + 31) // 32
    allowed = torch.bitwise_and(bitmask[:, :words].unsqueeze(-1), _BITS)  # 0 = disallowed
    addend = allowed.eq_(0).mul_(_NEG_INF_BITS).view(rows, 32 * words).view(torch.float32)
    logits[:, :covered].add_(addend[:, :covered])
    logits[:, covered:] = float("-inf")
