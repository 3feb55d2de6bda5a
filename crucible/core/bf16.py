"""bfloat16 bits in numpy, which has no bfloat16 dtype: a bf16 value is the high half of a float32.

Arrays of bf16 values travel as uint16 bits (or their raw bytes); MAX reads them through a
``Buffer.view(DType.bfloat16)`` of those bits.
"""

from __future__ import annotations

import numpy as np


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as uint16 bits.

    Args:
        a: Any float array (converted to float32 first).

    Returns:
        uint16 array of a's shape.
    """
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    # NaNs stay NaN (quiet), with their sign: rounding would carry a payload into Inf or wrap to 0.
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (bits >> 16) | 0x40, rounded).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits widened to float32 (exact).

    Args:
        bits: uint16 array.

    Returns:
        float32 array of bits' shape.
    """
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(a: np.ndarray) -> np.ndarray:
    """Rounds float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    return bf16_to_f32(bf16_bits(a))
