"""Conformance grids: every op against its float64 reference over odd, ragged and boundary sizes.

Tolerances (u = unit roundoff: 2^-24 for fp32, 2^-8 for bf16):
- Dot-product ops (matmul, qmatmul): |y - ref| <= 2 * u32 * sqrt(K) * (|x| @ |w|^T) elementwise, the
  probabilistic forward-error bound of an fp32-accumulated dot product (the worst case K * u is far too
  loose to catch layout bugs). Inputs are exact in the compute dtype (bf16 inputs are pre-rounded), so
  for bf16 outputs only the final rounding adds u_bf16 * |ref|.
- Quantized weights: the reference is the gguf package's dequantization of the same bytes, so the
  bound is the fp32 one, not a quantization-error one; a misread block layout fails it by orders of
  magnitude (checked explicitly).
- qmatmul act=q8 (int8 activations, CPU): checked twice. Against the reference on x quantized the
  way the kernel does (reference.quantize_activations_q8), with the fp32 bound: the integer block
  products are exact, so only float rounding remains. And against the exact float reference with
  the bound sum_k |x_k - xq_k| |w_k| + the fp32 bound: the activation rounding error, worst case.
- rmsnorm, silu_mul: a few fp32 ulps of the result: 8 * u * |ref| + 1e-6.
- add_rmsnorm: the sum h + delta is rounded once in fp32 (and once more to bf16 there): 2 * u * |sum|;
  the norm of that rounded sum as rmsnorm.
- rope: the angle pos * inv_freq is formed in fp32, as transformers does: error <= 2 * u * pos * |x|.
- qkv_rope_write: q and the cached k as rope; the cached v must be the input bytes exactly.
- attention: outputs are convex combinations of V rows; fp32 softmax and accumulation over n keys
  give ~sqrt(n) * u relative error: 2e-5 * max|v| (fp32), 2^-6 * max|v| for bf16 inputs and outputs.
"""

from __future__ import annotations

import numpy as np

from crucible.conformance import reference as R
from crucible.conformance.harness import CaseResult, Harness, result, round_bf16

U32 = 2.0**-24
UBF16 = 2.0**-8

MATMUL_M = (1, 2, 7, 8, 64, 300)
MATMUL_KN = ((576, 1536), (1536, 576), (577, 33), (100, 1537), (16, 5))
# The CPU GEMM runs M in slabs of 2016 rows (matmul_cpu.mojo SLAB_M): 2100 rows take two.
MATMUL_BIG = ((1, 4096, 4096), (8, 4096, 4096), (64, 4096, 4096), (2100, 64, 40))
QTYPES = ("q4_0", "q4_1", "q8_0", "f16")
# The batch-1 int8 path takes blocks in octets (AVX2 without VNNI, Q4), then pairs, two pairs per step,
# then a lone pair and a lone block: K = 64 is one lone pair, 96 (3 blocks) a lone pair and a lone
# block, 160 (5) one step and a lone block, 480 (15) an octet, a step, a lone pair and a lone block,
# 576 (18) octets (or steps) and a lone pair.
QMATMUL_KN = ((576, 1536), (1536, 576), (64, 33), (96, 40), (160, 7), (480, 24), (4096, 96))
# (sequence lengths of new tokens, cached tokens per sequence, Hq, Hkv, D); page size 128.
ATTENTION_CASES = (
    ((1,), (0,), 8, 8, 64),
    ((5, 1, 17), (0, 0, 0), 9, 3, 64),
    ((300, 2), (0, 0), 8, 1, 128),
    ((1, 1, 1), (127, 128, 700), 32, 8, 128),   # decode across page boundaries
    ((40, 3), (200, 129), 12, 4, 64),           # prefill with history
    ((1,), (4095,), 32, 8, 128),                # long-context decode (key splits on CPU)
    ((6, 2), (600, 0), 12, 4, 64),              # short prefill chunks: slot order with key splits on CPU
    ((1,), (300,), 9, 3, 64),                   # short decode: 2 key splits below 512 keys on a 2-core CPU
    ((1,), (600,), 32, 8, 128),                 # 3 key splits rounded down to a whole round of tasks
)
PAGE_SIZE = 128


def _dot_bound(x: np.ndarray, w: np.ndarray, ref: np.ndarray, bf16_out: bool) -> np.ndarray:
    k = x.shape[1]
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    bound = 2 * U32 * np.sqrt(k) * scale + 1e-30
    if bf16_out:
        bound = bound + UBF16 * np.abs(ref)
    return bound


def _ratio(err: np.ndarray, bound: np.ndarray) -> float:
    """Largest error-to-bound ratio; <= 1 passes."""
    return float(np.max(err / bound)) if err.size else 0.0


def matmul_graph(h: Harness, dtype: str, variants: tuple[str, ...]):
    """One graph, one output per variant, symbolic in M, K, N."""
    from max.dtype import DType
    from max.graph import TensorType, ops

    from graphs import kernel_ops as K

    f32 = DType.float32
    compute = DType.bfloat16 if dtype == "bfloat16" else f32

    def build(x, w):
        xc, wc = ops.cast(x.tensor, compute), ops.cast(w.tensor, compute)
        return [ops.cast(K.matmul(xc, wc, v), f32) for v in variants]

    return h.model(f"matmul_{dtype}_{'_'.join(variants)}",
                   [TensorType(f32, ["m", "k"], device=h.ref), TensorType(f32, ["n", "k"], device=h.ref)], build)


def check_matmul(h: Harness, dtype: str, variants: tuple[str, ...]) -> list[CaseResult]:
    """crucible.matmul over the M x (K, N) grid for each variant (compiled once per dtype)."""
    model = matmul_graph(h, dtype, variants)
    rng = np.random.default_rng(0)
    shapes = [(m, k, n) for m in MATMUL_M for k, n in MATMUL_KN] + list(MATMUL_BIG)
    out = []
    for m, k, n in shapes:
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        if dtype == "bfloat16":
            x, w = round_bf16(x), round_bf16(w)
        ref = R.matmul(x, w)
        bound = _dot_bound(x, w, ref, dtype == "bfloat16")
        for variant, y in zip(variants, h.run(model, [x, w])):
            out.append(result(h, "crucible.matmul", variant, dtype, f"M={m} K={k} N={n}",
                              _ratio(np.abs(y - ref), bound), 1.0))
    return out


def qmatmul_acts(h: Harness, qtype: str) -> tuple[str, ...]:
    """Activation variants of qmatmul checked on this target: int8 activations exist for block
    formats on CPU only."""
    return ("f32", "q8") if h.target == "cpu" and qtype != "f16" else ("f32",)


def qmatmul_graph(h: Harness, qtype: str):
    """qmatmul for one block format, symbolic in M, N and the row bytes; one output per activation
    variant (qmatmul_acts)."""
    from max.dtype import DType
    from max.graph import TensorType, ops

    f32 = DType.float32

    def build(x, w):
        n_out = w.tensor.shape[0]
        out_type = TensorType(f32, [x.tensor.shape[0], n_out], device=h.ref)
        return [ops.custom("crucible.qmatmul", h.ref, [x.tensor, w.tensor], [out_type],
                           parameters={"qtype": qtype, "act": act})[0].tensor for act in qmatmul_acts(h, qtype)]

    return h.model(f"qmatmul_{qtype}", [TensorType(f32, ["m", "k"], device=h.ref),
                                        TensorType(DType.uint8, ["n", "kb"], device=h.ref)], build)


def check_qmatmul(h: Harness, qtype: str) -> list[CaseResult]:
    """crucible.qmatmul for one block format, plus the misread-layout control for Q4 formats."""
    model = qmatmul_graph(h, qtype)
    rng = np.random.default_rng(1)
    out = []
    # M = 20 runs the decode kernel in row groups of 8, 8 and 4 (qmatmul_cpu.mojo: M <= 32).
    # 2100 rows: the quantized GEMM in two M slabs.
    shapes = [(m, k, n) for m in MATMUL_M + (20,) for k, n in QMATMUL_KN] + [(1, 4096, 4096), (8, 4096, 4096),
                                                                            (2100, 64, 33)]
    for m, k, n in shapes:
        x = rng.standard_normal((m, k)).astype(np.float32)
        wq = R.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
        if qtype == "q8_0":
            # The format allows the byte -128, which the reference quantizer never writes (|q| <= 127);
            # the AVX2 int8 path's sign trick must take it (qdot_int8.dot_i8_i8). One per 7 blocks.
            blocks = wq.reshape(-1, 34)
            blocks[::7, 2 + 5] = 0x80
        wd = R.dequantize(wq, qtype, n, k)
        ref = x.astype(np.float64) @ wd.T
        ys = h.run(model, [x, wq])
        y = ys[0]
        bound = _dot_bound(x, wd, ref, False)
        out.append(result(h, "crucible.qmatmul", qtype, "float32", f"M={m} K={k} N={n}",
                          _ratio(np.abs(y - ref), bound), 1.0))
        if len(ys) > 1 and m <= 32:  # act=q8 changes only the decode path (M <= 32)
            xq = R.quantize_activations_q8(x)
            ref_q = xq @ wd.T
            out.append(result(h, "crucible.qmatmul", qtype + ":act=q8", "int8 x",
                              f"M={m} K={k} N={n}", _ratio(np.abs(ys[1] - ref_q), _dot_bound(xq, wd, ref_q, False)), 1.0))
            act_bound = np.abs(x.astype(np.float64) - xq) @ np.abs(wd).T + bound
            out.append(result(h, "crucible.qmatmul", qtype + ":act=q8-vs-float", "int8 x",
                              f"M={m} K={k} N={n}", _ratio(np.abs(ys[1] - ref), act_bound), 1.0))
        if qtype in ("q4_0", "q4_1") and (m, k, n) == (7, 576, 1536):
            wrong = x.astype(np.float64) @ R.dequantize_nibbles_swapped(wq, qtype, n, k).T
            # The control must fail: the kernel output is far from the misread-layout reference.
            misread = _ratio(np.abs(y - wrong), _dot_bound(x, wd, wrong, False))
            out.append(result(h, "crucible.qmatmul", qtype + ":misread-layout-is-detected", "float32",
                              f"M={m} K={k} N={n}", 1.0 / max(misread, 1e-30), 1.0))
    out += _qmatmul_special_x(h, model, qtype, rng)
    return out


def _qmatmul_special_x(h: Harness, model: object, qtype: str, rng: np.random.Generator) -> list[CaseResult]:
    """Activations that per-block scaling of x (qgemv_groups.mojo) must take, at M = 1.

    A zero block, blocks of tiny (1e-35, under its 1e-30 floor) and small (1e-20) values, an outlier of
    1e4 beside values of 1e-3; then a NaN in x, which must reach every output as in fp32 arithmetic.
    """
    k, n = 576, 1536
    x = rng.standard_normal((1, k)).astype(np.float32)
    x[0, 0:32] = 0.0
    x[0, 32:64] *= 1e-35
    x[0, 64:96] *= 1e-20
    x[0, 96:128] = 1e-3
    x[0, 100] = 1e4
    wq = R.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    wd = R.dequantize(wq, qtype, n, k)
    ref = x.astype(np.float64) @ wd.T
    y = h.run(model, [x, wq])[0]
    magnitude = wd
    if qtype in ("q4_0", "q4_1"):
        # Q4 kernels may sum the block offset apart, x . (d q) + offset sum x (Q4_1's m, Q4_0's -8 d),
        # as ggml's own dot products do: an x that mixes 1e4 and 1e-3 in a block then meets the
        # rounding of those two terms, which can be far above their sum (w = 0 at q = 8 for Q4_0).
        # The bound takes |d q| + |offset| for |w|.
        offset = R.q4_offsets(wq, qtype, n, k)
        magnitude = np.abs(wd - offset) + np.abs(offset)
    out = [result(h, "crucible.qmatmul", qtype + ":special-x", "float32",
                  f"M=1 K={k} N={n} x: zero, tiny, outlier blocks",
                  _ratio(np.abs(y - ref), _dot_bound(x, magnitude, ref, False)), 1.0)]
    x[0, 300] = np.nan
    y = h.run(model, [x, wq])[0]
    # The error is the count of outputs the NaN did not reach.
    out.append(result(h, "crucible.qmatmul", qtype + ":nan-propagates", "float32", f"M=1 K={k} N={n}",
                      float(np.sum(~np.isnan(y))), 0.5))
    return out


def elementwise_graph(h: Harness, dtype: str):
    """rmsnorm, rope in both layouts and silu_mul in one graph."""
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
                back(K.silu_mul(c(gu))), back(summed), back(normed)]

    types = [TensorType(f32, ["t", "h"], device=h.ref), TensorType(f32, ["h"], device=h.ref),
             TensorType(f32, ["t", "nh", "d"], device=h.ref), TensorType(f32, ["half"], device=h.ref),
             TensorType(u32, ["b1"], device=h.ref), TensorType(u32, ["b"], device=h.ref),
             TensorType(f32, ["t", "i2"], device=h.ref), TensorType(f32, ["t", "h"], device=h.ref)]
    return h.model(f"elementwise_{dtype}", types, build)


def check_elementwise(h: Harness, dtype: str) -> list[CaseResult]:
    """rmsnorm, add_rmsnorm, rope (both layouts) and silu_mul over odd row widths and ragged batches."""
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
                          _ratio(np.abs(ys[0] - ref), 8 * u * np.abs(ref) + 1e-6), 1.0))
        exact_sum = x.astype(np.float64) + delta
        out.append(result(h, "crucible.add_rmsnorm", "sum", dtype, f"{shape} H={width}",
                          _ratio(np.abs(ys[4] - exact_sum), 2 * u * np.abs(exact_sum) + 1e-30), 1.0))
        # The norm is of the sum as the kernel rounded it (ys[4]), as an unfused add would hand it on.
        ref = R.rmsnorm(ys[4], w, eps)
        out.append(result(h, "crucible.add_rmsnorm", "norm", dtype, f"{shape} H={width}",
                          _ratio(np.abs(ys[5] - ref), 8 * u * np.abs(ref) + 1e-6), 1.0))
        pos = R.positions(offs, start)
        rope_bound = 2 * U32 * (pos[:, None, None] + 1) * np.abs(xr).max() * 4 + 8 * u * np.abs(xr).max()
        for i, inter_layout in ((1, False), (2, True)):
            ref = R.rope(xr, invf, offs, start, inter_layout)
            out.append(result(h, "crucible.rope", "interleaved" if inter_layout else "half-split", dtype,
                              f"{shape} heads={heads} D={d} max_pos={int(pos.max())}",
                              _ratio(np.abs(ys[i] - ref), rope_bound), 1.0))
        ref = R.silu_mul(gu)
        out.append(result(h, "crucible.silu_mul", "", dtype, f"{shape} I={inter}",
                          _ratio(np.abs(ys[3] - ref), 8 * u * np.abs(ref) + 1e-6), 1.0))
    return out


def embedding_graph(h: Harness):
    """embedding from an f32 table and from each block format."""
    from max.dtype import DType
    from max.graph import TensorType

    from graphs import kernel_ops as K

    f32 = DType.float32
    hidden = 576
    types = [TensorType(DType.int64, ["t"], device=h.ref), TensorType(f32, ["v", hidden], device=h.ref)]
    types += [TensorType(DType.uint8, ["v", hidden // 32 * nb], device=h.ref)
              for nb in (18, 20, 34, 64)]

    def build(ids, tf32, t40, t41, t80, tf16):
        tables = {"f32": tf32, "q4_0": t40, "q4_1": t41, "q8_0": t80, "f16": tf16}
        return [K.embedding(ids.tensor, tables[q].tensor, hidden, q) for q in tables]

    return h.model("embedding", types, build)


def check_embedding(h: Harness) -> list[CaseResult]:
    """crucible.embedding from an f32 table and from every block format (exact decode expected)."""
    hidden = 576
    model = embedding_graph(h)
    rng = np.random.default_rng(3)
    table = rng.standard_normal((1000, hidden)).astype(np.float32)
    enc = {q: R.quantize(table, q) for q in QTYPES}
    ids = np.array([0, 999, 5, 5, 123], np.int64)
    ys = h.run(model, [ids, table] + [enc[q] for q in ("q4_0", "q4_1", "q8_0", "f16")])
    out = []
    for q, y in zip(("f32", "q4_0", "q4_1", "q8_0", "f16"), ys):
        ref = table[ids].astype(np.float64) if q == "f32" else R.dequantize(enc[q], q, 1000, hidden)[ids]
        # Decoding is exact up to one fp32 rounding of d * q + m.
        out.append(result(h, "crucible.embedding", q, "float32", f"T=5 V=1000 H={hidden}",
                          _ratio(np.abs(y - ref), 2 * U32 * np.abs(ref) + 1e-30), 1.0))
    return out


def probe_graph(h: Harness):
    """The benchmark's probes: read_bandwidth, and overhead_probe serial then parallel (x + 2)."""
    from max.dtype import DType
    from max.graph import TensorType

    from graphs import kernel_ops as K

    f32 = DType.float32
    types = [TensorType(f32, ["n"], device=h.ref), TensorType(f32, [1], device=h.ref)]
    return h.model("probes", types, lambda x, y: [K.read_bandwidth(x.tensor),
                                                  K.overhead_probe(K.overhead_probe(y.tensor, False), True)])


def check_probes(h: Harness) -> list[CaseResult]:
    """The probes compute what they claim (their timings are only meaningful if they do the work)."""
    model = probe_graph(h)
    # Integers 1..4: every partial sum is exact in fp32 (3M x 4 < 2^24), so any order gives the
    # exact total; the sum crosses the CPU probe's 4 MB chunks and spans many GPU blocks.
    x = np.random.default_rng(11).integers(1, 5, 3 * (1 << 20) + 77).astype(np.float32)
    total, y = h.run(model, [x, np.array([5.0], np.float32)])
    return [result(h, "crucible.read_bandwidth", "", "float32", f"n={x.size}",
                   float(abs(total[0] - x.astype(np.float64).sum())), 0.0),
            result(h, "crucible.overhead_probe", "serial+parallel", "float32", "[1]", float(abs(y[0] - 7.0)), 0.0)]


LAYERS, LAYER = 2, 1


def attention_graphs(h: Harness, dtype: str, d: int):
    """(ragged graph in `dtype`, paged write+attend graph with a float32 cache) for head_dim d."""
    from max.dtype import DType
    from max.graph import BufferType, TensorType, ops

    from graphs import kernel_ops as K

    f32, u32 = DType.float32, DType.uint32
    compute = DType.bfloat16 if dtype == "bfloat16" else f32
    layers, layer = LAYERS, LAYER

    def build_ragged(q, k, v, offs):
        c = lambda a: ops.cast(a.tensor, compute)  # noqa: E731
        return [ops.cast(K.attention_ragged(c(q), c(k), c(v), offs.tensor), f32)]

    ragged = h.model(f"attention_ragged_{dtype}_{d}", [
        TensorType(f32, ["t", "hq", d], device=h.ref), TensorType(f32, ["t", "hkv", d], device=h.ref),
        TensorType(f32, ["t", "hkv", d], device=h.ref), TensorType(u32, ["b1"], device=h.ref)], build_ragged)

    def build_paged(blocks, q, k, v, offs, lens, lut):
        K.kv_cache_write(blocks.buffer, k.tensor, v.tensor, offs.tensor, lens.tensor, lut.tensor, layer)
        return [K.attention_paged(q.tensor, blocks.buffer, offs.tensor, lens.tensor, lut.tensor, layer)]

    # The paged cache is float32 here on both targets (numpy has no bf16 buffers to hand MAX).
    paged = h.model(f"attention_paged_{d}", [
        BufferType(f32, ["pages", 2, layers, PAGE_SIZE, "hkv", d], device=h.ref),
        TensorType(f32, ["t", "hq", d], device=h.ref), TensorType(f32, ["t", "hkv", d], device=h.ref),
        TensorType(f32, ["t", "hkv", d], device=h.ref), TensorType(u32, ["b1"], device=h.ref),
        TensorType(u32, ["b"], device=h.ref), TensorType(u32, ["b", "mp"], device=h.ref)], build_paged)
    return ragged, paged


def qkv_rope_write_graph(h: Harness, d: int):
    """qkv_rope_write into a float32 cache: the half-split layout into layer 0, the interleaved one
    into layer 1, so one graph checks both; outputs the two roped q."""
    from max.dtype import DType
    from max.graph import BufferType, TensorType

    from graphs import kernel_ops as K

    f32, u32 = DType.float32, DType.uint32

    def build(blocks, qkv, invf, offs, lens, lut, hq_like):
        hq = hq_like.tensor.shape[0]
        return [K.qkv_rope_write(qkv.tensor, blocks.buffer, invf.tensor, offs.tensor, lens.tensor, lut.tensor,
                                 layer, hq, d, interleaved) for layer, interleaved in ((0, False), (1, True))]

    return h.model(f"qkv_rope_write_{d}", [
        BufferType(f32, ["pages", 2, LAYERS, PAGE_SIZE, "hkv", d], device=h.ref),
        TensorType(f32, ["t", "w"], device=h.ref), TensorType(f32, [d // 2], device=h.ref),
        TensorType(u32, ["b1"], device=h.ref), TensorType(u32, ["b"], device=h.ref),
        TensorType(u32, ["b", "mp"], device=h.ref),
        # Only its length matters: the number of q heads, a symbolic dim of the output.
        TensorType(u32, ["hq"], device=h.ref)], build)


def check_qkv_rope_write(h: Harness) -> list[CaseResult]:
    """qkv_rope_write over the attention cases' batches (ragged, with history, across pages): the
    returned q and the cached k against the rope reference, the cached v exact, in both layouts."""
    out = []
    rng = np.random.default_rng(5)
    # D = 80 (no attention case: attention takes 64 and 128) is rope's scalar CPU path.
    for lens, hist, hq, hkv, d in ATTENTION_CASES + (((3, 2), (126, 0), 4, 2, 80),):
        model = qkv_rope_write_graph(h, d)
        offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.uint32)
        t = int(offs[-1])
        starts = np.array(hist, np.uint32)
        qkv = rng.standard_normal((t, (hq + 2 * hkv) * d)).astype(np.float32)
        theta = 10000.0 if d == 64 else 500000.0
        invf = (1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
        lut, n_pages = _random_page_table(rng, lens, hist)
        blocks = rng.standard_normal((n_pages, 2, LAYERS, PAGE_SIZE, hkv, d)).astype(np.float32)
        buf = h.to_device(blocks)
        args = [buf] + [h.to_device(a) for a in (qkv, invf, offs, starts, lut, np.zeros(hq, np.uint32))]
        qs = h.run_buffers(model, args)
        from max.driver import CPU

        after = buf.to(CPU()).to_numpy()
        heads = qkv.reshape(t, hq + 2 * hkv, d)
        pos = R.positions(offs, starts)
        shape = f"new={list(lens)} cached={list(hist)} Hq={hq} Hkv={hkv} D={d}"
        for layer, interleaved in ((0, False), (1, True)):
            ref_q = R.rope(heads[:, :hq], invf, offs, starts, interleaved)
            ref_k = R.rope(heads[:, hq:hq + hkv], invf, offs, starts, interleaved)
            cached_k = np.empty_like(ref_k)
            v_exact = True
            for s in range(len(lens)):
                for n in range(lens[s]):
                    row, j = int(offs[s]) + n, hist[s] + n
                    page, slot = lut[s, j // PAGE_SIZE], j % PAGE_SIZE
                    cached_k[row] = after[page, 0, layer, slot]
                    v_exact &= bool(np.array_equal(after[page, 1, layer, slot], heads[row, hq + hkv:]))
            bound = 2 * U32 * (pos[:, None, None] + 1) * np.abs(heads).max() * 4 + 8 * U32 * np.abs(heads).max()
            variant = "interleaved" if interleaved else "half-split"
            out.append(result(h, "crucible.qkv_rope_write", variant + ":q", "float32", shape,
                              _ratio(np.abs(qs[layer] - ref_q), bound), 1.0))
            out.append(result(h, "crucible.qkv_rope_write", variant + ":k-cached", "float32", shape,
                              _ratio(np.abs(cached_k - ref_k), bound), 1.0))
            out.append(result(h, "crucible.qkv_rope_write", variant + ":v-cached-exact", "float32", shape,
                              0.0 if v_exact else 1.0, 0.0))
    return out


def check_attention(h: Harness, dtype: str) -> list[CaseResult]:
    """Ragged prefill and paged (write, then attend) attention over GQA ratios 1/3/4/8, head_dim
    64/128, sequences crossing page boundaries, prefill with history and long-context decode."""
    layers, layer = LAYERS, LAYER
    out = []
    rng = np.random.default_rng(4)
    for d in (64, 128):
        cases = [c for c in ATTENTION_CASES if c[4] == d]
        ragged, paged = attention_graphs(h, dtype, d)
        for lens, hist, hq, hkv, _ in cases:
            rnd = round_bf16 if dtype == "bfloat16" else (lambda a: a)
            offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.uint32)
            t = int(offs[-1])
            q = rnd(rng.standard_normal((t, hq, d)).astype(np.float32))
            keys = [rnd(rng.standard_normal((hi + n, hkv, d)).astype(np.float32)) for hi, n in zip(hist, lens)]
            vals = [rnd(rng.standard_normal((hi + n, hkv, d)).astype(np.float32)) for hi, n in zip(hist, lens)]
            starts = np.array(hist, np.uint32)
            shape = f"new={list(lens)} cached={list(hist)} Hq={hq} Hkv={hkv} D={d}"
            vmax = max(np.abs(v).max() for v in vals)
            tol = (2.0**-6 if dtype == "bfloat16" else 2e-5) * vmax
            if all(hi == 0 for hi in hist):
                k_new = np.concatenate(keys)
                v_new = np.concatenate(vals)
                y = h.run(ragged, [q, k_new, v_new, offs])[0]
                ref = R.attention(q, keys, vals, offs, starts)
                out.append(result(h, "crucible.attention_ragged", "", dtype, shape, np.abs(y - ref).max(), tol))
            if dtype == "float32":
                y, written_ok = _run_paged(h, paged, q, keys, vals, lens, hist, hkv, d, layers, layer, rng)
                ref = R.attention(q, keys, vals, offs, starts)
                out.append(result(h, "crucible.attention_paged", "", dtype, shape, np.abs(y - ref).max(), tol))
                out.append(result(h, "crucible.kv_cache_write", "", dtype, shape, 0.0 if written_ok else 1.0, 0.0))
    return out


def _random_page_table(rng, lens, hist) -> tuple[np.ndarray, int]:
    """Page table [B, max pages] for sequences of hist + lens tokens, pages drawn in random order
    from a cache with two spare pages; returns (table, number of pages in the cache)."""
    need = [-(-(hi + n) // PAGE_SIZE) for hi, n in zip(hist, lens)]
    n_pages = sum(need) + 2
    perm = rng.permutation(n_pages)
    lut = np.zeros((len(lens), max(need)), np.uint32)
    i = 0
    for s, pages in enumerate(need):
        lut[s, :pages] = perm[i:i + pages]
        i += pages
    return lut, n_pages


def _run_paged(h, model, q, keys, vals, lens, hist, hkv, d, layers, layer, rng):
    """Lays the cached K/V into randomly permuted pages, runs write + attend, checks the written rows."""
    b = len(lens)
    lut, n_pages = _random_page_table(rng, lens, hist)
    blocks = rng.standard_normal((n_pages, 2, layers, PAGE_SIZE, hkv, d)).astype(np.float32)
    for s in range(b):
        for j in range(hist[s]):
            blocks[lut[s, j // PAGE_SIZE], 0, layer, j % PAGE_SIZE] = keys[s][j]
            blocks[lut[s, j // PAGE_SIZE], 1, layer, j % PAGE_SIZE] = vals[s][j]
    offs = np.concatenate([[0], np.cumsum(lens)]).astype(np.uint32)
    k_new = np.concatenate([keys[s][hist[s]:] for s in range(b)])
    v_new = np.concatenate([vals[s][hist[s]:] for s in range(b)])
    buf = h.to_device(blocks)
    args = [buf] + [h.to_device(a) for a in (q, k_new, v_new, offs, np.array(hist, np.uint32), lut)]
    y = h.run_buffers(model, args)[0]
    from max.driver import CPU

    after = buf.to(CPU()).to_numpy()
    ok = True
    for s in range(b):
        for j in range(hist[s], hist[s] + lens[s]):
            page, slot = lut[s, j // PAGE_SIZE], j % PAGE_SIZE
            ok &= bool(np.array_equal(after[page, 0, layer, slot], keys[s][j]))
            ok &= bool(np.array_equal(after[page, 1, layer, slot], vals[s][j]))
    return y, ok


def compile_all(h: Harness) -> list[str]:
    """Builds (without running) every graph run_all would use on the harness's target."""
    if h.target == "cpu":
        matmul_graph(h, "float32", ("auto", "gemm", "gemv"))
    else:
        matmul_graph(h, "float32", ("tiled",))
        matmul_graph(h, "bfloat16", ("auto", "tiled", "tensor_core"))
    for qtype in QTYPES:
        qmatmul_graph(h, qtype)
    embedding_graph(h)
    for dtype in ("float32", "bfloat16") if h.target == "gpu" else ("float32",):
        elementwise_graph(h, dtype)
        for d in (64, 128):
            attention_graphs(h, dtype, d)
    for d in (64, 128):
        qkv_rope_write_graph(h, d)
    probe_graph(h)
    return sorted(h.compile_seconds)


def run_all(h: Harness) -> list[CaseResult]:
    """The whole grid for the harness's target (the dtypes each target supports)."""
    results: list[CaseResult] = []
    if h.target == "cpu":
        results += check_matmul(h, "float32", ("auto", "gemm", "gemv"))
    else:
        results += check_matmul(h, "float32", ("tiled",))
        results += check_matmul(h, "bfloat16", ("auto", "tiled", "tensor_core"))
    for qtype in QTYPES:
        results += check_qmatmul(h, qtype)
    results += check_elementwise(h, "float32")
    results += check_embedding(h)
    results += check_attention(h, "float32")
    results += check_qkv_rope_write(h)
    results += check_probes(h)
    if h.target == "gpu":
        results += check_elementwise(h, "bfloat16")
        results += check_attention(h, "bfloat16")
    return results
