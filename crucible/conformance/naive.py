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


def q4_offsets(wq: np.ndarray, qtype: str, n_out: int, k_in: int) -> np.ndarray:
    """The offset of every Q4 weight's block, float64 [N, K]: w = d q + offset, with offset = m
    (Q4_1) or -8 d (Q4_0)."""
    bb = {"q4_0": 18, "q4_1": 20}[qtype]
    heads = wq.reshape(n_out, k_in // 32, bb)[..., :4].copy()
    if qtype == "q4_0":
        per_block = -8.0 * heads[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    else:
        per_block = heads[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return np.repeat(per_block, 32, axis=1)


def dequantize_nibbles_swapped(wq: np.ndarray, qtype: str, n_out: int, k_in: int) -> np.ndarray:
    """A plausible misreading of Q4 blocks (high nibble first): the conformance test shows our bounds
    are tight enough to tell it apart from the real layout."""
    bb = {"q4_0": 18, "q4_1": 20}[qtype]
    head = 2 if qtype == "q4_0" else 4
    blocks = wq.reshape(n_out, k_in // 32, bb)
    swapped = blocks.copy()
    qs = blocks[..., head:]
    swapped[..., head:] = ((qs & 0x0F) << 4) | (qs >> 4)
    return dequantize(swapped.reshape(n_out, -1), qtype, n_out, k_in)


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


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """silu(gate) * up for gate_up [T, 2I] -> [T, I]."""
    gd = gate_up.astype(np.float64)
    width = gd.shape[1] // 2
    g, u = gd[:, :width], gd[:, width:]
    return g / (1.0 + np.exp(-g)) * u


def attention(q: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray], row_offsets: np.ndarray,
              start_pos: np.ndarray) -> np.ndarray:
    """Causal GQA attention of the new tokens q [T, Hq, D].

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
            for h in range(hq):
                s = k[: p + 1, h // group] @ q[t, h].astype(np.float64) / np.sqrt(d)
                e = np.exp(s - s.max())
                out[t, h] = (e / e.sum()) @ v[: p + 1, h // group]
    return out
