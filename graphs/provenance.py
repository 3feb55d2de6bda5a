"""Which kernels a graph runs: every op with its origin (Crucible's custom op or a MAX built-in) and target.

Read off the built graph itself (its MLIR ops), not from our own bookkeeping, so a fallback cannot hide.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

# Op families that make up the hot path of a decoder layer.
HOT_KINDS = ("matmul", "attention", "rmsnorm", "rope", "silu_mul", "embedding")
_HOT_PATTERNS = {
    "matmul": ("matmul", "qmatmul", "linalg", "gemm", "gemv"),
    "attention": ("attention", "mha", "flash", "mla"),
    "rmsnorm": ("rms_norm", "rmsnorm"),
    "rope": ("rope", "rotary"),
    "silu_mul": ("silu", "swiglu"),
    "embedding": ("embedding",),
}


@dataclass(frozen=True)
class OpRecord:
    """One op of a graph.

    Attributes:
        name: The op's name: a custom op's registered symbol, else the MAX op name.
        origin: "crucible" for our custom ops, "max" for MAX built-ins.
        target: Device the op is placed on ("cpu", "gpu") or "" when the op has none.
        kind: Hot-path family (see HOT_KINDS) or "" for glue ops.
    """

    name: str
    origin: Literal["crucible", "max"]
    target: str
    kind: str


def _kind(name: str) -> str:
    low = name.lower()
    for kind, patterns in _HOT_PATTERNS.items():
        if any(p in low for p in patterns):
            return kind
    return ""


def graph_ops(graph) -> list[OpRecord]:
    """Walks the graph's MLIR body and lists every op."""
    records: list[OpRecord] = []

    def walk(op) -> None:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    attrs = inner.attributes
                    name = str(inner.name)
                    if "symbol" in attrs and name.startswith("mo.custom"):
                        name = str(attrs["symbol"]).strip('"')
                    target = ""
                    if "device" in attrs:
                        target = "gpu" if '"gpu"' in str(attrs["device"]) else "cpu"
                    origin = "crucible" if name.startswith("crucible.") else "max"
                    records.append(OpRecord(name, origin, target, _kind(name)))
                    walk(inner)

    walk(graph._mlir_op)
    return records


def hot_path_fallbacks(records: list[OpRecord]) -> list[OpRecord]:
    """Hot-path ops that are not ours (each is a fallback to a MAX built-in)."""
    return [r for r in records if r.kind and r.origin != "crucible"]


def summary(records: list[OpRecord]) -> dict[str, object]:
    """Counts per (origin, name) and the list of hot-path fallbacks, for records and response metadata."""
    counts = Counter(f"{r.origin}:{r.name}" for r in records if r.origin == "crucible" or r.kind)
    fallbacks = sorted({r.name for r in hot_path_fallbacks(records)})
    return {"ops": dict(sorted(counts.items())), "hot_path_fallbacks": fallbacks,
            "targets": sorted({r.target for r in records if r.target})}
