"""Tolerances of the conformance grids (checks.py, matmul_checks.py, attention_checks.py).

u is the unit roundoff: 2^-24 for fp32, 2^-8 for bf16.

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

U32 = 2.0**-24
UBF16 = 2.0**-8


def dot_bound(x: np.ndarray, w: np.ndarray, ref: np.ndarray, bf16_out: bool) -> np.ndarray:
    """The dot-product bound above, elementwise. x: [M, K], w: [N, K], ref: [M, N] -> [M, N]."""
    k = x.shape[1]
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    bound = 2 * U32 * np.sqrt(k) * scale + 1e-30
    if bf16_out:
        bound = bound + UBF16 * np.abs(ref)
    return bound


def error_ratio(err: np.ndarray, bound: np.ndarray) -> float:
    """Largest error-to-bound ratio; <= 1 passes."""
    return float(np.max(err / bound)) if err.size else 0.0

