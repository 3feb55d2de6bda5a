# One tile of CPU decode / prefill attention (attention_cpu.mojo splits the work into tiles and
# tasks): the G = Hq / Hkv query heads of up to TQ tokens of one sequence and kv head, folded over
# blocks of BK keys with an online softmax in fp32.
#
# head_dim D is a compile-time parameter (64 or 128) so a row's output stays in registers.
# Prefill tiles (4+ tokens) transpose each key block once into kt[D, BK] and compute BK scores per row
# with BK / FW independent FMA chains instead of one horizontal sum per score; decode tiles keep
# per-key dot products (a transpose would cost more than their few rows save).
# Decode: key and value rows are prefetched in software (one head's rows are 4 KB apart in MAX's paged
# layout); scores are computed 4 keys x FW / 4 query rows at a time, their horizontal sums sharing one
# shuffle tree (shuffles.sum_lanes_tile); P @ V runs 4 query rows at a time (_pv_rows), reading each
# value row once per block. Value rows of a block inside one page are addressed by stride, and
# key / value rows by shift and mask (kv_layout.mojo), not by integer division.

from std.math import exp
from std.sys import PrefetchOptions, prefetch

from .common import F32, FW, Ptr, ceil_div
from .kv_layout import KVView
from .shuffles import sum_lanes_tile

comptime ROWS = 48        # query rows (tokens x heads of one kv group) per tile; scratch ~40 KB (L1)
comptime BK = 64          # keys per score block
comptime NEG_INF = Float32(-3.0e38)
comptime PF_KEYS = 16     # decode: software prefetch distance in keys (see tile_block)
comptime SLOT_PFK = 4     # slot-ordered decode: key rows prefetched this many keys ahead, into L1


# One task's scratch, carved from one float allocation (shared by the tasks, the split merge and
# benchmarks/profile_attention.mojo): o_part [ROWS, D] un-normalized outputs at the start, then
# ml [ROWS, 2] (running max, denominator), scores [ROWS, BK] and kt [D, BK] (a prefill tile's
# transposed key block). About 40 KB at D = 128: it stays in L1 / L2 while the task runs.
def tile_floats[D: Int]() -> Int:
    return ROWS * D + 2 * ROWS + ROWS * BK + D * BK


@always_inline
def tile_ml[D: Int](mem: Ptr[F32]) -> Ptr[F32]:
    return mem.unsafe_offset(ROWS * D)


@always_inline
def tile_scores[D: Int](mem: Ptr[F32]) -> Ptr[F32]:
    return mem.unsafe_offset(ROWS * D + 2 * ROWS)


@always_inline
def tile_kt[D: Int](mem: Ptr[F32]) -> Ptr[F32]:
    return mem.unsafe_offset(ROWS * D + 2 * ROWS + ROWS * BK)


@always_inline
def _prefetch_row[D: Int](p: Ptr[F32]):
    # Into L2, not L1: one head's rows are 4 KB apart, so they all fall into the same few L1 sets
    # and rows fetched into L1 ahead of use were evicted before it (the L2 hint measured faster).
    comptime for i in range(0, D, 16):  # one 64-byte line per 16 floats
        prefetch[PrefetchOptions().for_read().medium_locality()](p.unsafe_offset(i))


@always_inline
def _prefetch_block_rows[D: Int, HEAD_PREFETCH: Bool](
    kv: KVView[F32], b: Int, seq_start: Int, j: Int, g: Int, k_end: Int
):
    # While key j is scored: its value row (read by P @ V right after the block) and, walking one
    # head (HEAD_PREFETCH), its key row PF_KEYS ahead, into L2. Slot order reads whole slots, which
    # the hardware prefetchers bring towards L2, and fetches the value row and the key row
    # SLOT_PFK ahead into L1: without them P @ V waited on value rows, and with value rows alone the
    # scores waited on key rows (4 ahead measured better than 8).
    # The slot-order branch recomputes the row address (page-table load, two multiplies) for each
    # of its 16 prefetches: the compiler does not reuse loads across a prefetch. Computing both
    # addresses once made the block kernel faster alone but the op slower in a graph (bound by its
    # DRAM reads; why is not known), so it was not kept.
    comptime if HEAD_PREFETCH:
        _prefetch_row[D](kv.key(b, seq_start, min(j + PF_KEYS, k_end - 1), g))
        _prefetch_row[D](kv.value(b, seq_start, j, g))
    else:
        comptime for i in range(0, D, 16):
            prefetch[PrefetchOptions().for_read().high_locality()](kv.value(b, seq_start, j, g).unsafe_offset(i))
            prefetch[PrefetchOptions().for_read().high_locality()](kv.key(b, seq_start, min(j + SLOT_PFK, k_end - 1), g).unsafe_offset(i))


@always_inline
def _prefetch_next_window[D: Int](kv: KVView[F32], b: Int, seq_start: Int, j_next: Int, hkv: Int, lo: Int, hi: Int):
    # K and V rows of (key, head) pairs [lo, hi) of the next window in slot order (pair i: key
    # j_next + i // hkv, head i % hkv), into L2 (see cpu_tuning.NEXT_WINDOW_PREFETCH).
    if lo >= hi:
        return
    var j = j_next + lo // hkv
    var g = lo % hkv
    for _ in range(lo, hi):
        _prefetch_row[D](kv.key(b, seq_start, j, g))
        _prefetch_row[D](kv.value(b, seq_start, j, g))
        g += 1
        if g == hkv:
            g = 0
            j += 1


@always_inline
def _dot[D: Int](a: Ptr[F32], b: Ptr[F32]) -> Float32:
    # Up to 4 independent FMA chains: decode scores are one dot per key and query row, and a single
    # chain (8 dependent FMAs for D = 128) made them latency-bound.
    comptime C = D // FW
    comptime A = 4 if C >= 4 else C
    var acc = Array[SIMD[F32, FW], A](fill=SIMD[F32, FW](0))
    comptime for i in range(C):
        acc[i % A] = a.unsafe_load[width=FW](i * FW).fma(b.unsafe_load[width=FW](i * FW), acc[i % A])
    var total = acc[0]
    comptime for i in range(1, A):
        total += acc[i]
    return total.reduce_add()


@always_inline
def _pv_rows[D: Int, NR: Int](
    kv: KVView[F32], b: Int, seq_start: Int, g: Int, j0: Int, n: Int, v_first: Ptr[F32], v_run: Bool,
    probs: Ptr[F32], o_part: Ptr[F32], alpha_row: Array[Float32, ROWS], r0: Int,
):
    # o_part[r] = o_part[r] * alpha[r] + sum_j probs[r, j] * V[j0 + j] for rows r0 .. r0 + NR, in
    # column strips of SV vectors (NR x SV accumulators, SV value vectors and a broadcast probability
    # in registers: SV = 4 fits AVX-512's 32 registers at NR = 4, SV = 2 AVX2's 16).
    comptime SV = 4 if FW == 16 else 2
    comptime VW = SV * FW
    comptime assert D % VW == 0, "head_dim must be a multiple of the strip width"
    comptime for h in range(D // VW):
        var acc = Array[SIMD[F32, FW], NR * SV](fill=SIMD[F32, FW](0))
        comptime for i in range(NR):
            var orow = o_part.unsafe_offset((r0 + i) * D + h * VW)
            comptime for k in range(SV):
                acc[i * SV + k] = orow.unsafe_load[width=FW](k * FW) * alpha_row[r0 + i]
        for j in range(n):
            # Inside one page (or ragged K/V) value rows are slot_stride apart: no page lookup.
            var vp = v_first.unsafe_offset(j * kv.slot_stride) if v_run else kv.value(b, seq_start, j0 + j, g)
            var vv = Array[SIMD[F32, FW], SV](fill=SIMD[F32, FW](0))
            comptime for k in range(SV):
                vv[k] = vp.unsafe_load[width=FW](h * VW + k * FW)
            comptime for i in range(NR):
                var pj = SIMD[F32, FW](probs[unsafe_offset=(r0 + i) * BK + j])
                comptime for k in range(SV):
                    acc[i * SV + k] = vv[k].fma(pj, acc[i * SV + k])
        comptime for i in range(NR):
            var orow = o_part.unsafe_offset((r0 + i) * D + h * VW)
            comptime for k in range(SV):
                orow.unsafe_store(k * FW, acc[i * SV + k])


def run_tile[D: Int](
    q: Ptr[F32], kv: KVView[F32], b: Int, g: Int, G: Int, Hq: Int, seq_start: Int, ctx_start: Int,
    t0: Int, t1: Int, k_lo: Int, k_hi: Int, scale: Float32,
    o_part: Ptr[F32], ml_part: Ptr[F32], scores: Ptr[F32], kt: Ptr[F32], window: Int = 0,
):
    # Rows r = (t - t0) * G + h' for tokens t in [t0, t1) (ragged rows) and heads g*G + h'. Query t
    # sits at position ctx_start + t - seq_start and sees keys [k_lo, min(k_hi, pos + 1)), and with a
    # sliding window (window > 0) only those past pos - window.
    # Writes un-normalized outputs o_part[r, :], and ml_part[r] = (max, denominator).
    tile_init[D]((t1 - t0) * G, o_part, ml_part)
    var k_end = key_end(seq_start, ctx_start, t1, k_hi)
    var j0 = max(k_lo, window_start(ctx_start + t0 - seq_start, window))
    while j0 < k_end:
        var j1 = min(k_end, j0 + BK)
        tile_block[D, True](q, kv, b, g, G, Hq, seq_start, ctx_start, t0, t1, j0, j1, k_end, scale,
                             o_part, ml_part, scores, kt, window=window)
        j0 = j1


@always_inline
def window_start(pos: Int, window: Int) -> Int:
    # The first key a query at `pos` sees: pos - window + 1 with a sliding window (window > 0), else 0.
    return max(0, pos - window + 1) if window > 0 else 0


@always_inline
def key_end(seq_start: Int, ctx_start: Int, t1: Int, k_hi: Int) -> Int:
    # One past the last key any row of the tile (last token t1 - 1) sees, capped at k_hi.
    return min(k_hi, ctx_start + (t1 - 1) - seq_start + 1)


@always_inline
def tile_init[D: Int](rows: Int, o_part: Ptr[F32], ml_part: Ptr[F32]):
    # Empty online-softmax state: o_part[rows, D] = 0, ml_part[rows] = (max -inf, denominator 0).
    for r in range(rows):
        ml_part[unsafe_offset=2 * r] = NEG_INF
        ml_part[unsafe_offset=2 * r + 1] = 0
        for d in range(D):
            o_part[unsafe_offset=r * D + d] = 0


def tile_block[D: Int, HEAD_PREFETCH: Bool](
    q: Ptr[F32], kv: KVView[F32], b: Int, g: Int, G: Int, Hq: Int, seq_start: Int, ctx_start: Int,
    t0: Int, t1: Int, j0: Int, j1: Int, k_end: Int, scale: Float32,
    o_part: Ptr[F32], ml_part: Ptr[F32], scores: Ptr[F32], kt: Ptr[F32],
    pf_next: Int = 0, pf_lo: Int = 0, pf_hi: Int = 0, hkv: Int = 1, window: Int = 0,
):
    # Folds keys [j0, j1) (at most BK of them, all < k_end) into the tile's online-softmax state.
    # HEAD_PREFETCH: the task walks one head (see _prefetch_block_rows); False in slot order.
    # pf_*: slot order's next-window prefetch, pairs [pf_lo, pf_hi) of the window at key pf_next
    # (_prefetch_next_window), spread over this block's groups of 4 keys.
    var rows = (t1 - t0) * G
    var n = j1 - j0
    if t1 - t0 >= 4 and n >= FW:
        # Prefill tiles: the key block is transposed once into kt[d, jj] so every row computes FW
        # scores per vector FMA (no horizontal sum per score, ~3x fewer instructions than dots).
        for jj in range(n):
            var kp = kv.key(b, seq_start, j0 + jj, g)
            for d in range(D):
                kt[unsafe_offset=d * BK + jj] = kp[unsafe_offset=d]
        for jj in range(n, BK):
            for d in range(D):
                kt[unsafe_offset=d * BK + jj] = 0
        for r in range(rows):
            var t = t0 + r // G
            var pos = ctx_start + t - seq_start
            var qp = q.unsafe_offset((t * Hq + g * G + r % G) * D)
            var srow = scores.unsafe_offset(r * BK)
            # BK / FW independent accumulators: one FMA chain would wait on FMA latency every step.
            var acc = Array[SIMD[F32, FW], BK // FW](fill=SIMD[F32, FW](0))
            for d in range(D):
                var qd = SIMD[F32, FW](qp[unsafe_offset=d])
                comptime for c in range(BK // FW):
                    acc[c] = qd.fma(kt.unsafe_load[width=FW](d * BK + c * FW), acc[c])
            comptime for c in range(BK // FW):
                srow.unsafe_store(c * FW, acc[c] * scale)
            if j1 - 1 > pos:  # causal edge: keys in this row's future
                for jj in range(max(0, pos + 1 - j0), n):
                    srow[unsafe_offset=jj] = NEG_INF
    else:
        # Scores: each key row is loaded once and dotted with every query row of the tile. Row
        # offsets and positions are computed once per block (a division by G per row and key
        # showed up in profiles of decode).
        var q_row = Array[Int, ROWS](fill=0)
        var pos_row = Array[Int, ROWS](fill=0)
        for r in range(rows):
            var t = t0 + r // G
            pos_row[r] = ctx_start + t - seq_start
            q_row[r] = (t * Hq + g * G + r % G) * D
        var j_tail = j0
        # 4 keys x NQ query rows at a time (NQ = FW / 4: 4 with AVX-512, 2 with AVX2, 1 with SSE or
        # NEON, so the FW accumulators, 4 key vectors and a query vector fit the register file): FW
        # dot products reduced together by one shuffle tree (sum_lanes_tile) instead of FW horizontal sums, and each
        # loaded key vector serves NQ rows. AVX-512 pads a last partial group of rows (repeating
        # the tile's last row, not stored); AVX2 scores a lone last row (G = 3) with per-key dots,
        # since a padded 4 x 2 group costs as much as two rows (measured slower at 9/3 heads).
        comptime NQ = FW // 4
        var r_grouped = rows if FW == 16 else rows - rows % NQ
        var pf_per = ceil_div(pf_hi - pf_lo, max(1, n // 4))  # pairs prefetched per group of 4 keys
        var pf_at = pf_lo
        while j_tail + 4 <= j1:
            comptime if not HEAD_PREFETCH:
                _prefetch_next_window[D](kv, b, seq_start, pf_next, hkv, pf_at, min(pf_hi, pf_at + pf_per))
                pf_at += pf_per
            var kp4 = Array[Ptr[F32], 4](fill=q)
            comptime for ki in range(4):
                var j = j_tail + ki
                kp4[ki] = kv.key(b, seq_start, j, g)
                _prefetch_block_rows[D, HEAD_PREFETCH](kv, b, seq_start, j, g, k_end)
            var r0 = 0
            while r0 < r_grouped:
                var qpr = Array[Ptr[F32], NQ](fill=q)
                comptime for ri in range(NQ):
                    qpr[ri] = q.unsafe_offset(q_row[min(r0 + ri, rows - 1)])
                var acc = Array[SIMD[F32, FW], FW](fill=SIMD[F32, FW](0))
                comptime for c in range(D // FW):
                    var kc = Array[SIMD[F32, FW], 4](fill=SIMD[F32, FW](0))
                    comptime for ki in range(4):
                        kc[ki] = kp4[ki].unsafe_load[width=FW](c * FW)
                    comptime for ri in range(NQ):
                        var qv = qpr[ri].unsafe_load[width=FW](c * FW)
                        comptime for ki in range(4):
                            acc[ri * 4 + ki] = qv.fma(kc[ki], acc[ri * 4 + ki])
                var sv = sum_lanes_tile[FW](acc^) * scale  # lane ri * 4 + ki: row r0 + ri, key j_tail + ki
                comptime for ri in range(NQ):
                    var r = r0 + ri
                    if r < rows:
                        comptime for ki in range(4):
                            var keep = j_tail + ki <= pos_row[r]
                            scores[unsafe_offset=r * BK + (j_tail + ki - j0)] = sv[ri * 4 + ki] if keep else NEG_INF
                r0 += NQ
            for r in range(r_grouped, rows):
                comptime for ki in range(4):
                    var s = NEG_INF
                    if j_tail + ki <= pos_row[r]:
                        s = _dot[D](q.unsafe_offset(q_row[r]), kp4[ki]) * scale
                    scores[unsafe_offset=r * BK + (j_tail + ki - j0)] = s
            j_tail += 4
        for j in range(j_tail, j1):
            var kp = kv.key(b, seq_start, j, g)
            # One head's rows are slot_stride apart (4 KB for 8 heads x 128 floats), a pattern the
            # hardware prefetchers do not follow when a task walks one head.
            _prefetch_block_rows[D, HEAD_PREFETCH](kv, b, seq_start, j, g, k_end)
            for r in range(rows):
                var s = NEG_INF
                if j <= pos_row[r]:
                    s = _dot[D](q.unsafe_offset(q_row[r]), kp) * scale
                scores[unsafe_offset=r * BK + (j - j0)] = s
    if window > 0:
        # Sliding window: keys at or before pos - window are out of a row's sight, as future keys are.
        for r in range(rows):
            var first = window_start(ctx_start + t0 + r // G - seq_start, window)
            for jj in range(min(n, first - j0)):
                scores[unsafe_offset=r * BK + jj] = NEG_INF
    # Online softmax, row by row: block max, rescale factor alpha, probabilities in place of the
    # scores, running denominator.
    var v_first = kv.value(b, seq_start, j0, g)
    var v_run = not kv.paged or (j0 // kv.page_size == (j1 - 1) // kv.page_size)
    var alpha_row = Array[Float32, ROWS](fill=1)
    for r in range(rows):
        var srow = scores.unsafe_offset(r * BK)
        var m_old = ml_part[unsafe_offset=2 * r]
        # Block max as a vector reduction (a scalar max chain costs its latency per key).
        var m_vec = SIMD[F32, FW](NEG_INF)
        var jm = 0
        while jm + FW <= n:
            m_vec = max(m_vec, srow.unsafe_load[width=FW](jm))
            jm += FW
        var m_blk = m_vec.reduce_max()
        while jm < n:
            m_blk = max(m_blk, srow[unsafe_offset=jm])
            jm += 1
        if m_blk == NEG_INF:
            # Every key of this block is in this row's future: it adds nothing.
            for jz in range(n):
                srow[unsafe_offset=jz] = 0
            continue
        var m_new = max(m_old, m_blk)
        var alpha = exp(m_old - m_new)
        var l = ml_part[unsafe_offset=2 * r + 1] * alpha
        var jj = 0
        while jj + FW <= n:
            var p = exp(srow.unsafe_load[width=FW](jj) - m_new)
            srow.unsafe_store(jj, p)
            l += p.reduce_add()
            jj += FW
        while jj < n:
            var p1 = exp(srow[unsafe_offset=jj] - m_new)
            srow[unsafe_offset=jj] = p1
            l += p1
            jj += 1
        alpha_row[r] = alpha
        ml_part[unsafe_offset=2 * r] = m_new
        ml_part[unsafe_offset=2 * r + 1] = l
    # P @ V for up to 4 rows at once: each value row is read once per block for all of them.
    # Row by row, a row's 64 value rows (4 KB apart, all in the same L1 sets) were evicted before
    # the next row came back to them, and every row re-read them from L2.
    var r0 = 0
    while r0 < rows:
        var nr = min(4, rows - r0)
        if nr == 4:
            _pv_rows[D, 4](kv, b, seq_start, g, j0, n, v_first, v_run, scores, o_part, alpha_row, r0)
        elif nr == 3:
            _pv_rows[D, 3](kv, b, seq_start, g, j0, n, v_first, v_run, scores, o_part, alpha_row, r0)
        elif nr == 2:
            _pv_rows[D, 2](kv, b, seq_start, g, j0, n, v_first, v_run, scores, o_part, alpha_row, r0)
        else:
            _pv_rows[D, 1](kv, b, seq_start, g, j0, n, v_first, v_run, scores, o_part, alpha_row, r0)
        r0 += nr


@always_inline
def write_rows[D: Int](o: Ptr[F32], o_part: Ptr[F32], ml: Ptr[F32], t0: Int, t1: Int, g: Int, G: Int, Hq: Int):
    # o[t, g * G + h', :] = o_part[r] / denominator[r] for the tile's rows r = (t - t0) * G + h'.
    for r in range((t1 - t0) * G):
        var t = t0 + r // G
        var dst = o.unsafe_offset((t * Hq + g * G + r % G) * D)
        var inv = 1.0 / ml[unsafe_offset=2 * r + 1]
        for d in range(D):
            dst[unsafe_offset=d] = o_part[unsafe_offset=r * D + d] * inv
