"""Bad inputs to the ops raise clear errors instead of reading out of bounds."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.conformance.checks import (
    EMBED_HIDDEN, LAYERS, PAGE_SIZE, QTYPES, embedding_graph, qkv_rope_write_graph, qmatmul_graph,
)
from crucible.conformance.matmul_checks import quantized_weights
from crucible.conformance.harness import Harness
from crucible.conformance.naive import quantize


def test_qmatmul_rejects_a_byte_width_that_is_not_whole_blocks(cpu_harness: Harness) -> None:
    model = qmatmul_graph(cpu_harness, "q4_0")
    x = np.ones((1, 64), np.float32)
    bad = np.zeros((8, 35), np.uint8)  # 64 values need 2 * 18 = 36 bytes per row
    with pytest.raises(Exception, match="do not hold"):
        cpu_harness.run(model, [x, bad])
    wq = quantize(np.ones((8, 64), np.float32), "q4_0")
    assert cpu_harness.run(model, [x, wq])[0].shape == (1, 8)


def test_embedding_rejects_ids_outside_the_vocabulary(cpu_harness: Harness) -> None:
    model = embedding_graph(cpu_harness)
    table = np.zeros((1000, EMBED_HIDDEN), np.float32)
    enc = [quantized_weights(1000, EMBED_HIDDEN, q, np.random.default_rng(0)) for q in QTYPES]
    with pytest.raises(Exception, match="outside the vocabulary"):
        cpu_harness.run(model, [np.array([3, 1000], np.int64), table, *enc])


def _qkv_args(h: Harness, width: int, cached: int, lut: np.ndarray, pages: int = 2) -> list[object]:
    # One sequence of 2 new tokens, Hq = 2, Hkv = 1, D = 64, after `cached` tokens.
    blocks = np.zeros((pages, 2, LAYERS, PAGE_SIZE, 1, 64), np.float32)
    invf = np.ones(32, np.float32)
    arrays = (np.ones((2, width), np.float32), invf, np.array([0, 2], np.uint32), np.array([cached], np.uint32),
              lut, np.zeros(2, np.uint32))
    return [h.to_device(blocks)] + [h.to_device(a) for a in arrays]


def test_qkv_rope_write_rejects_rows_beyond_the_page_table_and_bad_pages(cpu_harness: Harness) -> None:
    model = qkv_rope_write_graph(cpu_harness, 64)
    ok = np.array([[1]], np.uint32)
    assert cpu_harness.run_buffers(model, _qkv_args(cpu_harness, 4 * 64, 0, ok))[0].shape == (2, 2, 64)
    # 127 cached + 2 new tokens need a second page that the table does not have.
    with pytest.raises(Exception, match="page table has room for 128"):
        cpu_harness.run_buffers(model, _qkv_args(cpu_harness, 4 * 64, 127, ok))
    with pytest.raises(Exception, match="page id out of range"):
        cpu_harness.run_buffers(model, _qkv_args(cpu_harness, 4 * 64, 0, np.array([[2]], np.uint32)))
    # qkv rows must hold (Hq + 2 Hkv) D = 256 values.
    with pytest.raises(Exception, match="qkv is"):
        cpu_harness.run_buffers(model, _qkv_args(cpu_harness, 3 * 64, 0, ok))
