"""float64 numpy references for every kernel, written for clarity, not speed.

Each function mirrors one ``crucible.*`` op's contract (see the op headers in ``kernels/``). Quantized
weights are decoded with the ``gguf`` package's own dequantizer, so our kernels are checked against the
format's reference implementation, not against a second copy of our own reading of it.
"""

from __future__ import annotations

import numpy as np


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = x @ w^T. x: [M, K], w: [N, K] -> [M, N]."""
    return x.astype(np.float64) @ w.astype(np.float64).T


def dequantize(wq: np.ndarray, qtype: str, n_out: int, k_in: int) -> np.ndarray:
    """Decodes GGUF block rows [N, bytes] to float64 [N, K] with the gguf package."""
    import gguf

    if qtype == "f16":
        return wq.view(np.float16).reshape(n_out, k_in).astype(np.float64)
    gtype = gguf.GGMLQuantizationType[qtype.upper()]
    return gguf.quants.dequantize(wq, gtype).astype(np.float64).reshape(n_out, k_in)


def quantize(w: np.ndarray, qtype: str) -> np.ndarray:
    """Encodes float32 [N, K] rows into GGUF blocks [N, bytes] with the gguf package's quantizer."""
    import gguf

    if qtype == "f16":
        return w.astype(np.float16).view(np.uint8).reshape(w.shape[0], -1)
    if qtype.endswith("_k") or qtype.startswith("iq"):
        raise ValueError(f"gguf-py cannot encode {qtype}: use random_blocks")
    return gguf.quants.quantize(w.astype(np.float32), gguf.GGMLQuantizationType[qtype.upper()])


def quantize_activations_q8(x: np.ndarray) -> np.ndarray:
    """x [M, K] as the int8-activation path sees it: per 32-value block, d = max|x| / 127 and
    q = round-half-even(x * (127 / max|x|)) in float32, returned dequantized (d * q) in float64."""
    m, k = x.shape
    blocks = x.astype(np.float32).reshape(m, k // 32, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.round(blocks * inv)
    d = (amax / np.float32(127.0)).astype(np.float32)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(m, k)


# Byte range [start, end) of the quants inside one block of each format (ggml-common.h), for the formats
# whose kernels may round an offset term apart from d * q. Q5_0, Q3_K and Q6_K subtract their offset
# (16, 4, 32) from the integer quant, exactly, so they have none; Q8_0's is zero.
_QUANT_BYTES = {"q4_0": (2, 18), "q4_1": (4, 20), "q5_1": (4, 24), "q2_k": (16, 80), "q4_k": (16, 144),
                "q5_k": (16, 176)}


def block_offsets(wq: np.ndarray, qtype: str, n_out: int, k_in: int) -> np.ndarray:
    """The value every weight would take with its quants zeroed, float64 [N, K]: the offset term that
    kernels may round apart from d * q (Q4_1's m, Q4_0's -8 d, a K-quant's -dmin m); zero for F16/BF16."""
    if qtype not in _QUANT_BYTES:
        return np.zeros((n_out, k_in))
    import gguf

    start, end = _QUANT_BYTES[qtype]
    _, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype.upper()]]
    blocks = wq.reshape(n_out, -1, nbytes).copy()
    blocks[..., start:end] = 0
    return dequantize(blocks.reshape(n_out, -1), qtype, n_out, k_in)


# Byte offsets of the f16 fields (d, dmin) in each block of the formats gguf-py cannot encode
# (ggml-common.h).
HALF_OFFSETS = {"q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,),
                       "iq4_nl": (0,), "iq4_xs": (0,)}


def random_blocks(n_out: int, k_in: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Random valid rows of `qtype` blocks [N, bytes]: random quants and packed scales, with every half
    field (d, dmin) a finite value near 0.01. For the K-quants and IQ4 formats, which gguf-py decodes but
    cannot encode."""
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype.upper()]]
    blocks = rng.integers(0, 256, (n_out, k_in // block, nbytes), dtype=np.uint8)
    for at in HALF_OFFSETS[qtype]:
        d = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[..., at:at + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(n_out, -1)


def dequantize_halves_swapped(wq: np.ndarray, qtype: str, n_out: int, k_in: int) -> np.ndarray:
    """A plausible misreading of any format: values 16..31 of each 32-value chunk taken for values
    0..15 and back (for Q4 blocks, the high nibble read first). The conformance test shows our bounds
    are tight enough to tell it apart from the real layout."""
    w = dequantize(wq, qtype, n_out, k_in).reshape(n_out, k_in // 32, 2, 16)
    return w[:, :, ::-1, :].reshape(n_out, k_in)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last dim."""
    xd = x.astype(np.float64)
    return xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


def positions(row_offsets: np.ndarray, start_pos: np.ndarray) -> np.ndarray:
    """Position of every ragged token: start_pos[b] + index within sequence b."""
    return np.concatenate([
        start_pos[b] + np.arange(row_offsets[b + 1] - row_offsets[b]) for b in range(len(start_pos))
    ]).astype(np.float64)


def rope(x: np.ndarray, inv_freq: np.ndarray, row_offsets: np.ndarray, start_pos: np.ndarray,
         interleaved: bool) -> np.ndarray:
    """Rotary embedding of x [T, heads, D] at the ragged positions."""
    pos = positions(row_offsets, start_pos)
    ang = pos[:, None] * inv_freq.astype(np.float64)[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    xd = x.astype(np.float64)
    out = np.empty_like(xd)
    if interleaved:
        x1, x2 = xd[..., 0::2], xd[..., 1::2]
        out[..., 0::2], out[..., 1::2] = x1 * c - x2 * s, x2 * c + x1 * s
    else:
        half = xd.shape[-1] // 2
        x1, x2 = xd[..., :half], xd[..., half:]
        out[..., :half], out[..., half:] = x1 * c - x2 * s, x2 * c + x1 * s
    return out


def silu_mul(gate_up: np.ndarray, act: str = "silu") -> np.ndarray:
    """act(gate) * up for gate_up [T, 2I] -> [T, I]; act "silu" or "gelu_tanh" (the tanh form, as
    transformers' gelu_pytorch_tanh writes it)."""
    gd = gate_up.astype(np.float64)
    width = gd.shape[1] // 2
    g, u = gd[:, :width], gd[:, width:]
    if act == "gelu_tanh":
        return 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g**3))) * u
    if act != "silu":
        raise ValueError(f"act must be 'silu' or 'gelu_tanh', got {act!r}")
    return g / (1.0 + np.exp(-g)) * u


def attention(q: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray], row_offsets: np.ndarray,
              start_pos: np.ndarray, window: int = 0) -> np.ndarray:
    """Causal GQA attention of the new tokens q [T, Hq, D]; with window > 0, a query at position p
    sees only positions p - window + 1 .. p (a sliding window).

    Args:
        q: Queries of the new tokens of all sequences.
        keys: Per sequence, all its keys [n_ctx, Hkv, D] (cached ones first, then the new ones).
        values: Same for values.
        row_offsets: [B + 1] ragged offsets of the new tokens.
        start_pos: [B] cached tokens per sequence (0 for plain prefill).
    """
    T, hq, d = q.shape
    out = np.zeros((T, hq, d))
    for b in range(len(start_pos)):
        k = keys[b].astype(np.float64)
        v = values[b].astype(np.float64)
        group = hq // k.shape[1]
        for i, t in enumerate(range(row_offsets[b], row_offsets[b + 1])):
            p = int(start_pos[b]) + i
            lo = max(0, p - window + 1) if window > 0 else 0
            for h in range(hq):
                s = k[lo: p + 1, h // group] @ q[t, h].astype(np.float64) / np.sqrt(d)
                e = np.exp(s - s.max())
                out[t, h] = (e / e.sum()) @ v[lo: p + 1, h // group]
    return out
