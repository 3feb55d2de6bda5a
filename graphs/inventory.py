"""What a model file holds, read from its headers alone: architecture, parameters, tensors per type and
weight bytes. `crucible models PATH` prints it, and every load prints it with the load time and the
resident memory, so a user sees what was found before (or instead of) a long load, including tensor
types Crucible does not run yet.
"""

from __future__ import annotations

import json
import resource
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from crucible.core.registry import ModelSource


@dataclass(frozen=True)
class ModelInventory:
    """A model's contents by its headers.

    Attributes:
        name: The model as the user named it.
        format: "gguf" or "hf".
        architecture: GGUF `general.architecture`, or the HF config's first `architectures` entry.
        parameters: Weight elements in all tensors.
        tensor_types: Tensor count per storage type (GGUF type names such as Q4_K, or safetensors dtypes).
        weight_bytes: Bytes of tensor data.
    """

    name: str
    format: str
    architecture: str
    parameters: int
    tensor_types: dict[str, int]
    weight_bytes: int

    def line(self) -> str:
        """One line: `name: arch, 135.0M parameters, tensors F32 61, Q4_K 16, 91.2 MiB`."""
        types = ", ".join(f"{t} {n}" for t, n in sorted(self.tensor_types.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"{self.name}: {self.architecture}, {_count(self.parameters)} parameters, tensors {types}, "
                f"{self.weight_bytes / 2**20:.1f} MiB ({self.format})")


def inventory(source: ModelSource) -> ModelInventory:
    """Reads a GGUF file's tensor table, or a Hugging Face folder's config and safetensors headers."""
    if source.format == "gguf":
        return _gguf(source)
    return _hf(source)


def load_line(inv: ModelInventory, seconds: float) -> str:
    """The inventory line of a finished load, with its time and the process's peak resident memory."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return f"{inv.line()}; loaded in {seconds:.1f} s, peak resident memory {peak_kib / 2**20:.2f} GiB"


def _gguf(source: ModelSource) -> ModelInventory:
    from crucible.core.gguf_meta import open_gguf

    reader = open_gguf(source.path)
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode("utf-8") if field is not None else "unknown"
    types: Counter[str] = Counter()
    params = nbytes = 0
    for t in reader.tensors:
        types[t.tensor_type.name] += 1
        params += int(t.n_elements)
        nbytes += int(t.n_bytes)
    return ModelInventory(source.name, "gguf", arch, params, dict(types), nbytes)


def _hf(source: ModelSource) -> ModelInventory:
    config = json.loads((source.path / "config.json").read_text()) if (source.path / "config.json").is_file() else {}
    arch = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
    types: Counter[str] = Counter()
    params = nbytes = 0
    for path in sorted(source.path.glob("*.safetensors")):
        for name, entry in _safetensors_header(path).items():
            if name == "__metadata__":
                continue
            types[entry["dtype"]] += 1
            n = 1
            for d in entry["shape"]:
                n *= d
            params += n
            start, end = entry["data_offsets"]
            nbytes += end - start
    return ModelInventory(source.name, "hf", arch, params, dict(types), nbytes)


def _safetensors_header(path: Path) -> dict:
    """The JSON header of a .safetensors file (an 8-byte little-endian length, then the JSON)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)
