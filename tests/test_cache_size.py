"""Benchmark buffers sized past the last-level cache (benchmarks/cache_size.py) and the flag on rows
that read faster than the probe (benchmarks/kernels.flag_over_probe). No graph compiles."""

from __future__ import annotations

import pytest

from benchmarks.cache_size import ColdSize, llc_bytes
from benchmarks.kernel_report import format_table
from benchmarks.kernel_row import Row
from benchmarks.kernels import flag_over_probe
from benchmarks.timing import Timing


def test_llc_is_the_largest_cache_sysfs_lists(tmp_path) -> None:
    for i, size in enumerate(("48K", "2048K", "300M", "")):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert llc_bytes(tmp_path) == 300 << 20
    assert llc_bytes(tmp_path / "missing") == 32 << 20


def test_copies_and_chains_stream_four_llcs() -> None:
    cold = ColdSize(300 << 20)
    assert cold.cold_bytes == 1200 << 20
    for nbytes in (518_400, 3_538_944, 9_437_184, 67_108_864, 2 << 30):
        ops, sets = cold.chain(nbytes, 128)
        assert 2 <= ops <= 128
        assert ops * sets * nbytes >= min(cold.cold_bytes, 2 * nbytes)  # enough distinct bytes
        assert (ops - 1) * sets * nbytes < cold.cold_bytes or sets == 1  # and not far more
        assert cold.copies(nbytes) * nbytes >= cold.cold_bytes
    assert cold.copies(2 << 30) == 1
    with pytest.raises(ValueError):
        ColdSize(0)


def _row(variant: str, nbytes: float, us: dict[str, float]) -> Row:
    row = Row("qmatmul", "target", {"M": 1, "K": 4096, "N": 4096}, variant, "float32", "cpu", 1.0, nbytes)
    return row.fill({name: Timing(t * 1e-6, t * 1e-6, t * 1e-6, 3) for name, t in us.items()})


def test_rows_faster_than_the_probe_are_flagged() -> None:
    nbytes = 9.4e6
    rows = [_row("target:q4_0", nbytes, {"crucible": nbytes / 20e3, "max_fp32": nbytes / 45e3}),  # 20, 45 GB/s
            _row("cached:q4_0", nbytes, {"crucible": nbytes / 80e3})]  # in cache on purpose
    flag_over_probe(rows, probe_gbps=30.0)
    assert rows[0].over_probe == ["max_fp32"] and rows[1].over_probe == []
    table = format_table(rows)
    assert any(line.rstrip().endswith("!") and "max_fp32" in line for line in table.splitlines())
    assert "bytes from a cache, not DRAM" in table
    # Control: the same rows against a faster probe are not flagged.
    flag_over_probe(rows, probe_gbps=50.0)
    assert rows[0].over_probe == []


def test_interleaved_rounds_shuffle_the_order_and_keep_each_round() -> None:
    from benchmarks.timing import time_interleaved

    calls: list[str] = []
    systems = {name: (lambda name=name: calls.append(name)) for name in "abcd"}
    t = time_interleaved(systems, rounds=6, block_s=0.0, min_block=1, max_block=1, warmup=0)
    orders = {tuple(calls[i:i + 4]) for i in range(0, 24, 4)}
    assert len(orders) > 1 and all(sorted(o) == list("abcd") for o in orders)  # every round runs all, shuffled
    assert all(len(x.rounds) == 6 and x.reps == 6 for x in t.values())
