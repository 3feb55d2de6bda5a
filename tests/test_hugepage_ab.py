"""The huge-page copy used by benchmarks/hugepage_ab.py: same values, 2 MB-aligned, no graph compiled."""

from __future__ import annotations

import numpy as np

from benchmarks.hugepage_ab import HUGE, huge_page_copy


def test_huge_page_copy_is_aligned_and_equal() -> None:
    # An odd byte count and a float dtype: the copy must keep shape, dtype and every value.
    a = np.random.default_rng(0).standard_normal((3, 1001), dtype=np.float32)
    out, region = huge_page_copy(a)
    assert out.ctypes.data % HUGE == 0
    assert out.shape == a.shape and out.dtype == a.dtype
    np.testing.assert_array_equal(out, a)
    assert len(region) >= a.nbytes + HUGE
