"""How much memory a benchmark must stream so that its reads come from DRAM, not from a cache.

The last-level cache comes from sysfs (cpu0's largest cache). A timed buffer, or the set of copies a
benchmark rotates through, holds at least COLD_MULTIPLE times that: by the time a copy comes round
again, enough other bytes have been read to evict it under any replacement policy (one VM here
reports a 300 MiB L3; the old fixed 64 MB chains fitted in it four times over).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

COLD_MULTIPLE = 4
FALLBACK_LLC_BYTES = 32 << 20
# H100 and H200 have a 50 MB L2; sysfs does not describe a GPU, so a bound for sm_80/sm_90 parts.
GPU_L2_BYTES = 64 << 20


def llc_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest cache sysfs lists for cpu0 (the last level), in bytes; 32 MiB if sysfs has none."""
    sizes = []
    for index in cache_dir.glob("index*"):
        text = (index / "size").read_text().strip() if (index / "size").is_file() else ""
        if text:
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=FALLBACK_LLC_BYTES)


@dataclass(frozen=True)
class ColdSize:
    """The bytes a benchmark streams past the cache, and how a buffer of one size gets there.

    Attributes:
        cache_bytes: The cache to defeat (CPU: sysfs LLC; GPU: GPU_L2_BYTES).
        multiple: Cold bytes as a multiple of cache_bytes.
    """

    cache_bytes: int
    multiple: int = COLD_MULTIPLE

    def __post_init__(self) -> None:
        if self.cache_bytes <= 0 or self.multiple < 1:
            raise ValueError(f"need a positive cache size and multiple, got {self.cache_bytes}, {self.multiple}")

    @property
    def cold_bytes(self) -> int:
        return self.cache_bytes * self.multiple

    def copies(self, nbytes: int) -> int:
        """Distinct copies of an nbytes buffer that together stream cold_bytes (at least 1)."""
        return max(1, math.ceil(self.cold_bytes / max(1, nbytes)))

    def chain(self, nbytes: int, max_ops: int) -> tuple[int, int]:
        """(ops per graph, weight sets to rotate through) for a chain of nbytes-weight ops: at most
        max_ops ops per graph (compile time and graph size grow with it), and as many distinct sets
        of their weights as it takes to stream cold_bytes before a set comes round again."""
        copies = self.copies(nbytes)
        sets = math.ceil(copies / max_ops)
        return max(2, math.ceil(copies / sets)), sets

    @classmethod
    def for_target(cls, target: str) -> ColdSize:
        return cls(llc_bytes() if target == "cpu" else GPU_L2_BYTES)
