"""Conformance grids: every op against its float64 reference over odd, ragged and boundary sizes.

The bounds and why they hold are tolerance.py's docstring. matmul and qmatmul are matmul_checks.py,
attention and qkv_rope_write attention_checks.py; the elementwise ops, the embedding and the probes
are here, with compile_all / run_all, which walk every grid.
"""

from __future__ import annotations

import numpy as np

from crucible.conformance import naive as R
from crucible.conformance.attention_checks import (
    ATTENTION_CASES, HEAD_DIMS, LAYER, LAYERS, PAGE_SIZE, attention_graphs, check_attention, check_qkv_rope_write,
    qkv_rope_write_graph,
)
from crucible.conformance.harness import CaseResult, Harness, result
from crucible.core.bf16 import round_bf16
from crucible.conformance.matmul_checks import (
    QTYPES, RANDOM_QTYPES, check_matmul, check_qmatmul, matmul_graph, qmatmul_graph, quantized_weights,
)
from crucible.conformance.mlp_checks import MLP_TRIPLES, check_mlp, mlp_graph, mlp_triples
from crucible.conformance.qmatmul2_checks import QMATMUL2_PAIRS, check_qmatmul2, qmatmul2_graph, qmatmul2_pairs
from crucible.conformance.tolerance import U32, UBF16, error_ratio

# Every matmul variant of a target is checked over the whole grid, each its own output of one graph per
# dtype: {target: {dtype: variants}}.
MATMUL_VARIANTS = {
    "cpu": {"float32": ("auto", "gemm", "gemv")},
    "gpu": {"float32": ("tiled", "gemv"), "bfloat16": ("auto", "tiled", "tensor_core", "tensor_core_vec", "gemv")},
}

__all__ = [
    "ATTENTION_CASES", "LAYER", "LAYERS", "PAGE_SIZE", "QTYPES", "attention_graphs", "check_attention", "check_elementwise",
    "check_embedding", "check_matmul", "check_mlp", "check_probes", "check_qkv_rope_write", "check_qmatmul", "check_qmatmul2",
    "compile_all", "elementwise_graph", "embedding_graph", "matmul_graph", "probe_graph", "qkv_rope_write_graph",
    "qmatmul_graph", "qmatmul2_graph", "QMATMUL2_PAIRS", "MLP_TRIPLES", "mlp_graph", "run_all",
]


def elementwise_graph(h: Harness, dtype: str):
    """rmsnorm, rope in both layouts and silu_mul (silu and gelu_tanh) in one graph."""
    from max.dtype import DType
    from max.graph import TensorType, ops

    from graphs import kernel_ops as K

    f32, u32 = DType.float32, DType.uint32
    compute = DType.bfloat16 if dtype == "bfloat16" else f32
    eps = 1e-5

    def build(x, w, xr, invf, offs, start, gu, delta):
        c = lambda v: ops.cast(v.tensor, compute)  # noqa: E731
        back = lambda v: ops.cast(v, f32)  # noqa: E731
        summed, normed = K.add_rmsnorm(c(x), c(delta), c(w), eps)
        return [back(K.rmsnorm(c(x), c(w), eps)),
                back(K.rope(c(xr), invf.tensor, offs.tensor, start.tensor, False)),
                back(K.rope(c(xr), invf.tensor, offs.tensor, start.tensor, True)),
                back(K.silu_mul(c(gu))), back(summed), back(normed), back(K.silu_mul(c(gu), "gelu_tanh"))]

    types = [TensorType(f32, ["t", "h"], device=h.ref), TensorType(f32, ["h"], device=h.ref),
             TensorType(f32, ["t", "nh", "d"], device=h.ref), TensorType(f32, ["half"], device=h.ref),
             TensorType(u32, ["b1"], device=h.ref), TensorType(u32, ["b"], device=h.ref),
             TensorType(f32, ["t", "i2"], device=h.ref), TensorType(f32, ["t", "h"], device=h.ref)]
    return h.model(f"elementwise_{dtype}", types, build)


def check_elementwise(h: Harness, dtype: str) -> list[CaseResult]:
    """rmsnorm, add_rmsnorm, rope (both layouts) and silu_mul (silu, gelu_tanh) over odd row widths and
    ragged batches; a control checks each gated activation against the other's reference, which must fail."""
    eps = 1e-5
    model = elementwise_graph(h, dtype)
    rng = np.random.default_rng(2)
    u = UBF16 if dtype == "bfloat16" else U32
    rnd = round_bf16 if dtype == "bfloat16" else (lambda a: a)
    out = []
    # D = 80: D / 2 = 40 is not a multiple of rope's CPU vector width (16 pairs): the scalar path.
    for lens, starts, width, heads, d, inter in (((1,), (0,), 576, 9, 64, 1536), ((3, 1, 9), (5, 0, 1000), 577, 3, 128, 1537),
                                                  ((64,), (4000,), 4096, 32, 128, 14336),
                                                  ((2, 5), (3, 60), 100, 5, 80, 100)):
        offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.uint32)
        start = np.array(starts, np.uint32)
        t = int(offs[-1])
        x = rnd(rng.standard_normal((t, width)).astype(np.float32))
        w = rnd(rng.standard_normal(width).astype(np.float32))
        xr = rnd(rng.standard_normal((t, heads, d)).astype(np.float32))
        theta = 10000.0 if d == 64 else 500000.0
        invf = (1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
        gu = rnd(rng.standard_normal((t, 2 * inter)).astype(np.float32))
        delta = rnd(rng.standard_normal((t, width)).astype(np.float32))
        ys = h.run(model, [x, w, xr, invf, offs, start, gu, delta])
        shape = f"T={t} B={len(lens)}"
        ref = R.rmsnorm(x, w, eps)
        out.append(result(h, "crucible.rmsnorm", "", dtype, f"{shape} H={width}",
                          error_ratio(np.abs(ys[0] - ref), 8 * u * np.abs(ref) + 1e-6), 1.0))
        exact_sum = x.astype(np.float64) + delta
        out.append(result(h, "crucible.add_rmsnorm", "sum", dtype, f"{shape} H={width}",
                          error_ratio(np.abs(ys[4] - exact_sum), 2 * u * np.abs(exact_sum) + 1e-30), 1.0))
        # The norm is of the sum as the kernel rounded it (ys[4]), as an unfused add would hand it on.
        ref = R.rmsnorm(ys[4], w, eps)
        out.append(result(h, "crucible.add_rmsnorm", "norm", dtype, f"{shape} H={width}",
                          error_ratio(np.abs(ys[5] - ref), 8 * u * np.abs(ref) + 1e-6), 1.0))
        pos = R.positions(offs, start)
        rope_bound = 2 * U32 * (pos[:, None, None] + 1) * np.abs(xr).max() * 4 + 8 * u * np.abs(xr).max()
        for i, inter_layout in ((1, False), (2, True)):
            ref = R.rope(xr, invf, offs, start, inter_layout)
            out.append(result(h, "crucible.rope", "interleaved" if inter_layout else "half-split", dtype,
                              f"{shape} heads={heads} D={d} max_pos={int(pos.max())}",
                              error_ratio(np.abs(ys[i] - ref), rope_bound), 1.0))
        for act, y in (("silu", ys[3]), ("gelu_tanh", ys[6])):
            ref = R.silu_mul(gu, act)
            out.append(result(h, "crucible.silu_mul", "" if act == "silu" else act, dtype, f"{shape} I={inter}",
                              error_ratio(np.abs(y - ref), 8 * u * np.abs(ref) + 1e-6), 1.0))
    # Control: the two variants differ (silu(g) = g sigmoid(g), gelu_tanh(g) ~ g sigmoid(1.6 g)), so a
    # kernel that ignored `act` would fail one of them; here each output against the other's reference.
    ref = R.silu_mul(gu, "silu")
    miss = error_ratio(np.abs(ys[6] - ref), 8 * u * np.abs(ref) + 1e-6)
    out.append(result(h, "crucible.silu_mul", "act-ignored-is-detected", dtype, f"{shape} I={inter}",
                      1.0 / max(miss, 1e-30), 1.0))
    return out


EMBED_HIDDEN = 768  # a multiple of the K-quants' 256-value super-block


def embedding_graph(h: Harness):
    """embedding from an f32 table and from each block format (QTYPES)."""
    from max.dtype import DType
    from max.graph import TensorType

    from graphs import kernel_ops as K

    f32 = DType.float32
    hidden = EMBED_HIDDEN
    types = [TensorType(DType.int64, ["t"], device=h.ref), TensorType(f32, ["v", hidden], device=h.ref)]
    for q in QTYPES:
        block, nbytes = K.QUANT_BLOCKS[q]
        types.append(TensorType(DType.uint8, ["v", hidden // block * nbytes], device=h.ref))

    def build(ids, tf32, *tables):
        return [K.embedding(ids.tensor, tf32.tensor, hidden, "f32")] + [
            K.embedding(ids.tensor, t.tensor, hidden, q) for q, t in zip(QTYPES, tables)]

    return h.model("embedding", types, build)


def check_embedding(h: Harness) -> list[CaseResult]:
    """crucible.embedding from an f32 table and from every block format (exact decode expected)."""
    hidden = EMBED_HIDDEN
    model = embedding_graph(h)
    rng = np.random.default_rng(3)
    table = rng.standard_normal((1000, hidden)).astype(np.float32)
    enc = {q: quantized_weights(1000, hidden, q, rng) if q in RANDOM_QTYPES else R.quantize(table, q) for q in QTYPES}
    ids = np.array([0, 999, 5, 5, 123], np.int64)
    ys = h.run(model, [ids, table] + [enc[q] for q in QTYPES])
    out = []
    for q, y in zip(("f32",) + QTYPES, ys):
        ref = table[ids].astype(np.float64) if q == "f32" else R.dequantize(enc[q], q, 1000, hidden)[ids]
        # Decoding is exact up to the fp32 roundings of d * sc, the offset and d * q + offset (3 at most).
        offset = 0.0 if q == "f32" else R.block_offsets(enc[q], q, 1000, hidden)[ids]
        magnitude = np.abs(ref - offset) + np.abs(offset)
        out.append(result(h, "crucible.embedding", q, "float32", f"T=5 V=1000 H={hidden}",
                          error_ratio(np.abs(y - ref), 4 * U32 * magnitude + 1e-30), 1.0))
    return out


def probe_graph(h: Harness):
    """The benchmark's probes: read_bandwidth, and overhead_probe serial, parallel, then parallel in 5
    phases (x + 3)."""
    from max.dtype import DType
    from max.graph import TensorType

    from graphs import kernel_ops as K

    f32 = DType.float32
    types = [TensorType(f32, ["n"], device=h.ref), TensorType(f32, [1], device=h.ref)]
    return h.model("probes", types, lambda x, y: [K.read_bandwidth(x.tensor),
                                                  K.overhead_probe(K.overhead_probe(K.overhead_probe(y.tensor, False), True), True, 5)])


def check_probes(h: Harness) -> list[CaseResult]:
    """The probes compute what they claim (their timings are only meaningful if they do the work)."""
    model = probe_graph(h)
    # Integers 1..4: every partial sum is exact in fp32 (3M x 4 < 2^24), so any order gives the
    # exact total; the sum crosses the CPU probe's 4 MB chunks and spans many GPU blocks.
    x = np.random.default_rng(11).integers(1, 5, 3 * (1 << 20) + 77).astype(np.float32)
    total, y = h.run(model, [x, np.array([5.0], np.float32)])
    return [result(h, "crucible.read_bandwidth", "", "float32", f"n={x.size}",
                   float(abs(total[0] - x.astype(np.float64).sum())), 0.0),
            result(h, "crucible.overhead_probe", "serial+parallel+phases", "float32", "[1]", float(abs(y[0] - 8.0)), 0.0)]


def compile_all(h: Harness) -> list[str]:
    """Builds (without running) every graph run_all would use on the harness's target."""
    for dtype, variants in MATMUL_VARIANTS[h.target].items():
        matmul_graph(h, dtype, variants)
    for qtype in QTYPES:
        qmatmul_graph(h, qtype)
    for qa, qb in qmatmul2_pairs(h.target):
        qmatmul2_graph(h, qa, qb)
    for triple in mlp_triples(h.target):
        mlp_graph(h, *triple)
    embedding_graph(h)
    for dtype in ("float32", "bfloat16") if h.target == "gpu" else ("float32",):
        elementwise_graph(h, dtype)
        for d in HEAD_DIMS:
            attention_graphs(h, dtype, d)
    for d in (*HEAD_DIMS, 80):  # check_qkv_rope_write's head widths (80: rope's scalar CPU path)
        qkv_rope_write_graph(h, d)
    probe_graph(h)
    return sorted(h.compile_seconds)


def run_all(h: Harness) -> list[CaseResult]:
    """The whole grid for the harness's target (the dtypes each target supports)."""
    results: list[CaseResult] = []
    for dtype, variants in MATMUL_VARIANTS[h.target].items():
        results += check_matmul(h, dtype, variants)
    for qtype in QTYPES:
        results += check_qmatmul(h, qtype)
    for qa, qb in qmatmul2_pairs(h.target):
        results += check_qmatmul2(h, qa, qb)
    for triple in mlp_triples(h.target):
        results += check_mlp(h, *triple)
    results += check_elementwise(h, "float32")
    results += check_embedding(h)
    results += check_attention(h, "float32")
    results += check_qkv_rope_write(h)
    results += check_probes(h)
    if h.target == "gpu":
        results += check_elementwise(h, "bfloat16")
        results += check_attention(h, "bfloat16")
    return results
