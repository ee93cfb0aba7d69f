"""`dot`: tl.dot for every family's tiles, with the interpreter's bfloat16 workaround."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._device import interpreting


def upcast_bf16(dtype: torch.dtype) -> bool:
    """Triton 3.6's interpreter multiplies bfloat16 tiles as their raw uint16 bits (numpy has no
    bfloat16), so under it bfloat16 dots take float32 operands; exact, as bf16 products fit fp32."""
    return dtype == torch.bfloat16 and interpreting()


@triton.jit
def dot(a, b, acc, INPUT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot, with the interpreter's bfloat16 workaround (see upcast_bf16) compiled in or out."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
