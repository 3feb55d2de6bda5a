"""Conformance grids of matmul and qmatmul (bounds: tolerance.py)."""

from __future__ import annotations

import numpy as np

from crucible.conformance import naive as R
from crucible.conformance.harness import CaseResult, Harness, result
from crucible.core.bf16 import round_bf16
from crucible.conformance.tolerance import dot_bound, error_ratio

MATMUL_M = (1, 2, 7, 8, 64, 300)
# (72, 33): K % 8 == 0 in three 32-wide steps, the last one partial (tensor_core_vec's prefetch).
MATMUL_KN = ((576, 1536), (1536, 576), (577, 33), (100, 1537), (16, 5), (72, 33))
# The CPU GEMM runs M in slabs of 2016 rows (gemm_cpu.mojo SLAB_M): 2100 rows take two.
MATMUL_BIG = ((1, 4096, 4096), (8, 4096, 4096), (64, 4096, 4096), (2100, 64, 40))
QTYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "f16",
          "bf16")
# 256-value super-block formats (K multiples of 256), and the formats gguf-py decodes but cannot encode
# (random valid blocks).
SUPER_QTYPES = ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_xs")
RANDOM_QTYPES = SUPER_QTYPES + ("iq4_nl",)
# The batch-1 int8 path takes blocks in octets (AVX2 without VNNI, Q4), then pairs, two pairs per step,
# then a lone pair and a lone block: K = 64 is one lone pair, 96 (3 blocks) a lone pair and a lone
# block, 160 (5) one step and a lone block, 480 (15) an octet, a step, a lone pair and a lone block,
# 576 (18) octets (or steps) and a lone pair. The batch-1 float-activation Q4 rows on AVX-512BW
# (qgemv_groups.mojo) take groups of 4 blocks in sets of 4 groups, then lone blocks: 160 is a set with
# 1 of its 4 groups and a lone block, 288 (9) a set with 2 and a lone block, 480 a set with 3 and 3
# lone blocks, 576 one whole set and 2 lone blocks, 1536 and 4096 whole sets only.
# 2080 (65 blocks): the GPU `staged` read copies 64 blocks per step, so a full step, then a short one
# from a row start that is not 16-byte aligned (Q4_0 rows of 1170 bytes).
QMATMUL_KN = ((576, 1536), (1536, 576), (64, 33), (96, 40), (160, 7), (288, 17), (480, 24), (4096, 96),
              (2080, 33))
# K-quants and IQ4_XS: K is a multiple of their 256-value super-block; 256 is one super-block, 768 three, 1536
# SmolLM2's MLP width, 2304 nine (staged: a full step of 8 super-blocks, then one; Q6_K rows of 1890
# bytes); odd and small N.
QMATMUL_KN_K = ((768, 577), (256, 33), (1536, 7), (512, 96), (2304, 33))


def qmatmul_shapes(qtype: str) -> list[tuple[int, int, int]]:
    """(M, K, N) of the grid: every M (decode 1, batched decode 2-8 and 20 = 8 + 8 + 4, prefill 64-512)
    at every (K, N), then long rows and a two-slab GEMM."""
    if qtype in SUPER_QTYPES:
        kn = QMATMUL_KN_K
        return [(m, k, n) for m in MATMUL_M + (20,) for k, n in kn] + [(512, 1536, 96), (1, 4096, 4096),
                                                                       (8, 4096, 4096), (2100, 256, 33)]
    return [(m, k, n) for m in MATMUL_M + (20,) for k, n in QMATMUL_KN] + [(512, 576, 96), (1, 4096, 4096),
                                                                          (8, 4096, 4096), (2100, 64, 33)]


def quantized_weights(n: int, k: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """[N, bytes] of `qtype` blocks: gguf-py's encoding of random normal rows, or random valid blocks
    for the formats gguf-py cannot encode (RANDOM_QTYPES)."""
    if qtype in RANDOM_QTYPES:
        return R.random_blocks(n, k, qtype, rng)
    return R.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


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
        bound = dot_bound(x, w, ref, dtype == "bfloat16")
        for variant, y in zip(variants, h.run(model, [x, w])):
            out.append(result(h, "crucible.matmul", variant, dtype, f"M={m} K={k} N={n}",
                              error_ratio(np.abs(y - ref), bound), 1.0))
    return out


def qmatmul_acts(h: Harness, qtype: str) -> tuple[str, ...]:
    """Activation variants of qmatmul checked on this target: int8 activations exist for block
    formats on CPU only."""
    from graphs.kernel_ops import Q8_ACT_QTYPES

    return ("f32", "q8") if h.target == "cpu" and qtype in Q8_ACT_QTYPES else ("f32",)


# GPU read variants beyond "auto" (lanes today), each one more output of the same graph.
QMATMUL_GPU_VARIANTS = ("staged",)


def qmatmul_graph(h: Harness, qtype: str):
    """qmatmul for one block format, symbolic in M, N and the row bytes; one output per activation
    variant (qmatmul_acts), then on GPU one per read variant (QMATMUL_GPU_VARIANTS)."""
    from max.dtype import DType
    from max.graph import TensorType, ops

    f32 = DType.float32

    def build(x, w):
        n_out = w.tensor.shape[0]
        out_type = TensorType(f32, [x.tensor.shape[0], n_out], device=h.ref)
        def op(act: str, variant: str):
            return ops.custom("crucible.qmatmul", h.ref, [x.tensor, w.tensor], [out_type],
                              parameters={"qtype": qtype, "act": act, "variant": variant})[0].tensor

        variants = QMATMUL_GPU_VARIANTS if h.target == "gpu" else ()
        return [op(act, "auto") for act in qmatmul_acts(h, qtype)] + [op("f32", v) for v in variants]

    return h.model(f"qmatmul_{qtype}", [TensorType(f32, ["m", "k"], device=h.ref),
                                        TensorType(DType.uint8, ["n", "kb"], device=h.ref)], build)


def check_qmatmul(h: Harness, qtype: str) -> list[CaseResult]:
    """crucible.qmatmul for one block format, plus its misread-layout control."""
    model = qmatmul_graph(h, qtype)
    rng = np.random.default_rng(1)
    out = []
    shapes = qmatmul_shapes(qtype)
    for m, k, n in shapes:
        x = rng.standard_normal((m, k)).astype(np.float32)
        wq = quantized_weights(n, k, qtype, rng)
        if qtype == "q8_0":
            # The format allows the byte -128, which the reference quantizer never writes (|q| <= 127);
            # the AVX2 int8 path's sign trick must take it (qdot_int8.dot_i8_i8). One per 7 blocks.
            blocks = wq.reshape(-1, 34)
            blocks[::7, 2 + 5] = 0x80
        wd = R.dequantize(wq, qtype, n, k)
        ref = x.astype(np.float64) @ wd.T
        ys = h.run(model, [x, wq])
        y = ys[0]
        bound = dot_bound(x, magnitude(wq, wd, qtype), ref, False)
        out.append(result(h, "crucible.qmatmul", qtype, "float32", f"M={m} K={k} N={n}",
                          error_ratio(np.abs(y - ref), bound), 1.0))
        if h.target == "gpu":
            for variant, yv in zip(QMATMUL_GPU_VARIANTS, ys[1:]):
                out.append(result(h, "crucible.qmatmul", f"{qtype}:{variant}", "float32", f"M={m} K={k} N={n}",
                                  error_ratio(np.abs(yv - ref), bound), 1.0))
        elif len(ys) > 1 and m <= 32:  # act=q8 changes only the decode path (M <= 32)
            xq = R.quantize_activations_q8(x)
            ref_q = xq @ wd.T
            out.append(result(h, "crucible.qmatmul", qtype + ":act=q8", "int8 x",
                              f"M={m} K={k} N={n}", error_ratio(np.abs(ys[1] - ref_q), dot_bound(xq, wd, ref_q, False)), 1.0))
            act_bound = np.abs(x.astype(np.float64) - xq) @ np.abs(wd).T + bound
            out.append(result(h, "crucible.qmatmul", qtype + ":act=q8-vs-float", "int8 x",
                              f"M={m} K={k} N={n}", error_ratio(np.abs(ys[1] - ref), act_bound), 1.0))
        if (m, k, n) == (7,) + shapes[0][1:]:
            wrong = x.astype(np.float64) @ R.dequantize_halves_swapped(wq, qtype, n, k).T
            # The control must fail: the kernel output is far from the misread-layout reference.
            misread = error_ratio(np.abs(y - wrong), dot_bound(x, magnitude(wq, wd, qtype), wrong, False))
            out.append(result(h, "crucible.qmatmul", qtype + ":misread-layout-is-detected", "float32",
                              f"M={m} K={k} N={n}", 1.0 / max(misread, 1e-30), 1.0))
            if h.target == "gpu":  # each read variant reads the layout with its own loads
                for variant, yv in zip(QMATMUL_GPU_VARIANTS, ys[1:]):
                    misread = error_ratio(np.abs(yv - wrong), dot_bound(x, magnitude(wq, wd, qtype), wrong, False))
                    out.append(result(h, "crucible.qmatmul", f"{qtype}:{variant}:misread-layout-is-detected",
                                      "float32", f"M={m} K={k} N={n}", 1.0 / max(misread, 1e-30), 1.0))
            elif len(ys) > 1:  # the int8 path reads the layout with its own code: its own control
                xq = R.quantize_activations_q8(x)
                wrong_q = xq @ R.dequantize_halves_swapped(wq, qtype, n, k).T
                misread = error_ratio(np.abs(ys[1] - wrong_q), dot_bound(xq, magnitude(wq, wd, qtype), wrong_q, False))
                out.append(result(h, "crucible.qmatmul", qtype + ":act=q8:misread-layout-is-detected", "int8 x",
                                  f"M={m} K={k} N={n}", 1.0 / max(misread, 1e-30), 1.0))
    out += _qmatmul_special_x(h, model, qtype, rng)
    return out


def magnitude(wq: np.ndarray, wd: np.ndarray, qtype: str) -> np.ndarray:
    """|w| for the bound, as |scaled quant| + |offset|: kernels may round the block offset (Q4_1's m,
    Q4_0's -8 d, a K-quant's -dmin m) apart from d q, as ggml's own dot products do, and where the two
    nearly cancel that rounding can be far above |w| itself."""
    n, k = wd.shape
    offset = R.block_offsets(wq, qtype, n, k)
    return np.abs(wd - offset) + np.abs(offset)


def _qmatmul_special_x(h: Harness, model: object, qtype: str, rng: np.random.Generator) -> list[CaseResult]:
    """Activations that per-block scaling of x (qgemv_groups.mojo) must take, at M = 1.

    A zero block, blocks of tiny (1e-35, under its 1e-30 floor) and small (1e-20) values, an outlier of
    1e4 beside values of 1e-3; then a NaN in x, which must reach every output as in fp32 arithmetic.
    """
    k, n = (512, 1536) if qtype in SUPER_QTYPES else (576, 1536)
    x = rng.standard_normal((1, k)).astype(np.float32)
    x[0, 0:32] = 0.0
    x[0, 32:64] *= 1e-35
    x[0, 64:96] *= 1e-20
    x[0, 96:128] = 1e-3
    x[0, 100] = 1e4
    wq = quantized_weights(n, k, qtype, rng)
    wd = R.dequantize(wq, qtype, n, k)
    ref = x.astype(np.float64) @ wd.T
    y = h.run(model, [x, wq])[0]
    w_abs = magnitude(wq, wd, qtype)
    out = [result(h, "crucible.qmatmul", qtype + ":special-x", "float32",
                  f"M=1 K={k} N={n} x: zero, tiny, outlier blocks",
                  error_ratio(np.abs(y - ref), dot_bound(x, w_abs, ref, False)), 1.0)]
    x[0, 300] = np.nan
    y = h.run(model, [x, wq])[0]
    # The error is the count of outputs the NaN did not reach.
    out.append(result(h, "crucible.qmatmul", qtype + ":nan-propagates", "float32", f"M=1 K={k} N={n}",
                      float(np.sum(~np.isnan(y))), 0.5))
    return out
