"""Bad inputs to the ops raise clear errors instead of reading out of bounds."""

from __future__ import annotations

import numpy as np
import pytest

from crucible.conformance.checks import embedding_graph, qmatmul_graph
from crucible.conformance.harness import Harness
from crucible.conformance.reference import quantize


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
    table = np.zeros((1000, 576), np.float32)
    enc = [quantize(table, q) for q in ("q4_0", "q4_1", "q8_0", "f16")]
    with pytest.raises(Exception, match="outside the vocabulary"):
        cpu_harness.run(model, [np.array([3, 1000], np.int64), table, *enc])
