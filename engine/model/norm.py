"""RMSNorm, with the residual add before it: `RMSNorm(x)`, and `RMSNorm.add(x, residual)` for
(norm(x + residual), x + residual), as a decoder layer needs it twice.

Normalise in float32 then cast back, like transformers' LlamaRMSNorm. In float32 it runs the
C kernel (`engine/model/kernels/norm.c`) where it builds: one call for the add and the norm,
where torch's fused op runs as about ten small ops whose dispatch, at decode sizes, costs more
than their arithmetic. Elsewhere torch's: `nn.functional.rms_norm` in float32, the ops
spelled out in narrower dtypes. The model picks once, at start (`available`); the tests hold
the kernel's paths to torch's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.model import kernels

_PATHS = {"best": "ug_rms_norm", "portable": "ug_rms_norm_portable"}
PATHS = (*_PATHS, "torch")


def available(dtype: torch.dtype) -> bool:
    """Whether the kernel runs for activations of `dtype` on this machine."""
    return dtype == torch.float32 and kernels.builds("norm")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size), requires_grad=False)
        # The kernel's function for "best" or "portable", None for "torch" (`use`).
        self._function: Any = None

    def use(self, path: str) -> None:
        """Normalise by one of `PATHS` from now on (the model picks; the tests compare)."""
        if path not in PATHS:
            raise ValueError(f"path: one of {PATHS}, not {path!r}")
        function = _PATHS.get(path)
        self._function = function and getattr(kernels.optional_library("norm"), function)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._function is not None and x.dtype == torch.float32:
            return self._kernel(x, None)[0]
        return self._torch(x)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); the sum is exactly torch's `x + residual`."""
        if self._function is not None and x.dtype == torch.float32 == residual.dtype:
            return self._kernel(x, residual)
        total = x + residual
        return self._torch(total), total

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def _kernel(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.contiguous()
        cols = x.shape[-1]
        if cols != self.weight.shape[0]:
            raise ValueError(f"x: rows of {cols} for a norm of {tuple(self.weight.shape)}")
        if self.weight.dtype != torch.float32:
            raise ValueError(f"weight: the kernel norms float32, not {self.weight.dtype}")
        out = torch.empty_like(x)
        total = x
        if residual is not None:
            if residual.shape != x.shape:
                raise ValueError(f"residual: {tuple(residual.shape)} for x {tuple(x.shape)}")
            residual = residual.contiguous()
            total = torch.empty_like(x)
        self._function(
            x.data_ptr(),
            None if residual is None else residual.data_ptr(),
            None if residual is None else total.data_ptr(),
            self.weight.data_ptr(),
            x.numel() // cols,
            cols,
            self.eps,
            out.data_ptr(),
        )
        return out, total
