"""Reads a safetensors file into numpy without torch, bfloat16 included.

The format is an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape
and byte range, then the bytes. numpy has no bfloat16, so BF16 tensors come back as their uint16
bits (crucible.core.bf16 widens or keeps them); the file is memory-mapped, so a tensor costs memory
only once something reads or converts it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graphs.config import UnsupportedModelError

# safetensors dtype -> numpy dtype of the array handed back (BF16: the bits).
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


@dataclass(frozen=True)
class RawTensor:
    """One stored tensor.

    Attributes:
        dtype: The safetensors dtype name ("F32", "BF16", ...).
        array: The values (for BF16: uint16 bits), a read-only view of the mapped file; None for a
            dtype Crucible does not read (array_of raises then).
    """

    dtype: str
    array: np.ndarray | None


def read_safetensors(path: Path) -> dict[str, RawTensor]:
    """Every tensor of one safetensors file, memory-mapped.

    Raises:
        UnsupportedModelError: The header is malformed or a byte range does not fit its tensor.
    """
    if path.stat().st_size < 8:
        raise UnsupportedModelError(f"{path} is not a safetensors file (shorter than its header length)")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (header_len,) = struct.unpack("<Q", data[:8].tobytes())
    try:
        header = json.loads(data[8: 8 + header_len].tobytes())
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnsupportedModelError(f"{path} has an unreadable safetensors header: {exc}") from None
    body = data[8 + header_len:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if dtype not in _DTYPES:
            out[name] = RawTensor(str(dtype), None)  # an error only if the model reads it (`array_of`)
            continue
        try:
            start, end = (int(v) for v in info["data_offsets"])
            shape = [int(d) for d in info["shape"]]
        except (KeyError, TypeError, ValueError):
            raise UnsupportedModelError(f"{path}: tensor {name} has a malformed header entry") from None
        if not 0 <= start <= end <= body.size or end - start != int(np.prod(shape)) * np.dtype(_DTYPES[dtype]).itemsize:
            raise UnsupportedModelError(f"{path}: tensor {name}'s byte range [{start}, {end}) does not hold "
                                        f"{dtype} {shape} within the file")
        out[name] = RawTensor(dtype, body[start:end].view(_DTYPES[dtype]).reshape(shape))
    return out


def array_of(name: str, t: RawTensor, path: Path) -> np.ndarray:
    """The tensor's values, or a clear error for a dtype Crucible does not read."""
    if t.array is None:
        raise UnsupportedModelError(f"{path}: tensor {name} has dtype {t.dtype}, which Crucible does not read")
    return t.array
