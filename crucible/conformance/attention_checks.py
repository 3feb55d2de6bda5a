"""Conformance grids of attention (ragged prefill, paged prefill with history and decode) and of
qkv_rope_write, on MAX-layout paged caches with shuffled page tables (bounds: tolerance.py)."""

from __future__ import annotations

import numpy as np

from crucible.conformance import naive as R
from crucible.conformance.harness import CaseResult, Harness, result
from crucible.core.bf16 import round_bf16
from crucible.conformance.tolerance import U32, error_ratio

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
    ((1, 1, 1), (129, 130, 260), 8, 2, 256),    # head_dim 256 (Gemma 3); window edges: 130, 131 keys
    ((200, 7), (0, 0), 4, 1, 256),              # head_dim 256 prefill across the window
)
HEAD_DIMS = (64, 128, 256)
# Every case runs twice: causal over the whole prefix, and with a sliding window of WINDOW positions
# (a query at p sees p - WINDOW + 1 .. p). 130 is no multiple of the CPU's key blocks (64), slot windows
# (16-64) or pages (128), and the contexts above sit below, at and past it (decode at 128 to 4096 keys,
# prefill of 200 and 300 tokens, key splits).
WINDOW = 130
PAGE_SIZE = 128


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
        return [ops.cast(K.attention_ragged(c(q), c(k), c(v), offs.tensor, window), f32) for window in (0, WINDOW)]

    ragged = h.model(f"attention_ragged_{dtype}_{d}", [
        TensorType(f32, ["t", "hq", d], device=h.ref), TensorType(f32, ["t", "hkv", d], device=h.ref),
        TensorType(f32, ["t", "hkv", d], device=h.ref), TensorType(u32, ["b1"], device=h.ref)], build_ragged)

    def build_paged(blocks, q, k, v, offs, lens, lut):
        K.kv_cache_write(blocks.buffer, k.tensor, v.tensor, offs.tensor, lens.tensor, lut.tensor, layer)
        return [K.attention_paged(q.tensor, blocks.buffer, offs.tensor, lens.tensor, lut.tensor, layer, window)
                for window in (0, WINDOW)]

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
    # D = 80 (no attention case: attention takes 64, 128 and 256) is rope's scalar CPU path.
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
                              error_ratio(np.abs(qs[layer] - ref_q), bound), 1.0))
            out.append(result(h, "crucible.qkv_rope_write", variant + ":k-cached", "float32", shape,
                              error_ratio(np.abs(cached_k - ref_k), bound), 1.0))
            out.append(result(h, "crucible.qkv_rope_write", variant + ":v-cached-exact", "float32", shape,
                              0.0 if v_exact else 1.0, 0.0))
    return out


def check_attention(h: Harness, dtype: str) -> list[CaseResult]:
    """Ragged prefill and paged (write, then attend) attention over GQA ratios 1/3/4/8, head_dim
    64/128/256, sequences crossing page boundaries, prefill with history and long-context decode, each
    causal and with a sliding window."""
    layers, layer = LAYERS, LAYER
    out = []
    rng = np.random.default_rng(4)
    for d in HEAD_DIMS:
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
                ys = h.run(ragged, [q, k_new, v_new, offs])
                for window, y in zip((0, WINDOW), ys):
                    ref = R.attention(q, keys, vals, offs, starts, window)
                    out.append(result(h, "crucible.attention_ragged", _variant(window), dtype, shape,
                                      np.abs(y - ref).max(), tol))
            if dtype == "float32":
                ys, written_ok = _run_paged(h, paged, q, keys, vals, lens, hist, hkv, d, layers, layer, rng)
                for window, y in zip((0, WINDOW), ys):
                    ref = R.attention(q, keys, vals, offs, starts, window)
                    out.append(result(h, "crucible.attention_paged", _variant(window), dtype, shape,
                                      np.abs(y - ref).max(), tol))
                out.append(result(h, "crucible.kv_cache_write", "", dtype, shape, 0.0 if written_ok else 1.0, 0.0))
        if d == 128 and dtype == "float32":
            out.append(_window_control(h, ragged, rng))
    return out


def _variant(window: int) -> str:
    return f"window={window}" if window else ""


def _window_control(h: Harness, ragged: object, rng: np.random.Generator) -> CaseResult:
    """The windowed output must fail against the causal reference where the window cuts keys (a 300-token
    prefill): were the window ignored, the windowed cases would pass against the wrong reference too."""
    d, hq, hkv, n = 128, 8, 1, 300
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    k = rng.standard_normal((n, hkv, d)).astype(np.float32)
    v = rng.standard_normal((n, hkv, d)).astype(np.float32)
    offs = np.array([0, n], np.uint32)
    windowed = h.run(ragged, [q, k, v, offs])[1]
    causal = R.attention(q, [k], [v], offs, np.zeros(1, np.uint32))
    tol = 2e-5 * np.abs(v).max()
    miss = float(np.abs(windowed - causal).max())
    return result(h, "crucible.attention_ragged", "window-ignored-is-detected", "float32",
                  f"new=[{n}] Hq={hq} Hkv={hkv} D={d} window={WINDOW}", tol / max(miss, 1e-30), 1.0)
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
    ys = h.run_buffers(model, args)
    from max.driver import CPU

    after = buf.to(CPU()).to_numpy()
    ok = True
    for s in range(b):
        for j in range(hist[s], hist[s] + lens[s]):
            page, slot = lut[s, j // PAGE_SIZE], j % PAGE_SIZE
            ok &= bool(np.array_equal(after[page, 0, layer, slot], keys[s][j]))
            ok &= bool(np.array_equal(after[page, 1, layer, slot], vals[s][j]))
    return ys, ok
