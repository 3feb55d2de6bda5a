# CPU GEMM: y[M, N] = x[M, K] @ W[N, K]^T for M > 8 (prefill), W in the nn.Linear layout as fp32 rows
# or GGUF blocks (qmatmul_cpu.mojo's prefill path decodes them into the packed panel).
#
# Compute-bound: BLIS-style blocking.
#  - W is packed per (NC x KC) block into [NR-column panels][k][NR], so the micro-kernel reads it with
#    aligned vector loads; one KC x NR micro-panel stays in L1 (or streams from L2 at KC = 384). Full
#    panels are packed by FW x FW in-register transposes (block formats: per decoded block piece).
#  - x is packed once per call (per SLAB_M rows), by its own parallel pass, into
#    [KC k-blocks][MR-row tiles][k / FW][MR][FW]: the micro-kernel's broadcasts read one contiguous
#    MR x FW chunk per FW values of k, packing is whole-vector copies, and tasks walk it an MC x KC
#    block (in L2) at a time. Packed inside each n-block task it was packed N / NC times.
#  - Before each micro-tile its C lines are prefetched: C (M x NC) falls out of L2 between k-blocks,
#    and the tile's final load-add-store would otherwise wait on L3.
#  - Micro-tile MR x NV vectors: 6 x 4 with AVX-512 (24 accumulators of 32 registers), 6 x 2 with AVX2
#    (BLIS's Haswell tile). MR and KC are per host (cpu_tuning.mojo); see docs/kernels.md.

from max.gpu.host import DeviceContext
from std.sys import PrefetchOptions, prefetch

from .common import BytePtr, FW, F32, Ptr, ceil_div, cpu_threads, parallel_for, scratch
from .cpu_tuning import GEMM_KC_AVX512, GEMM_MR
from .quant import HALF, QBLOCK, decode_chunk
from .shuffles import transpose_tile

# Micro-tile rows (broadcast x values): 6, or 5 where the compiler's schedule for the target spills
# the 6-row tile's accumulators (cpu_tuning.GEMM_MR).
comptime MR = GEMM_MR
# Micro-tile vectors per row: MR * NV accumulators + NV panel loads + 1 broadcast must fit the vector
# registers, 32 with AVX-512 (6 x 4: 24 + 4 + 1) and 16 with AVX2 (6 x 2: 12 + 2 + 1, BLIS's Haswell tile).
comptime NV = 4 if FW == 16 else 2
comptime NR = NV * FW     # micro-tile columns
# k-block. With KC = 128 and AVX-512 the packed B micro-panel KC x NR stays in L1 (32 KB); a longer
# one streams from L2 (4 panel loads per 24 FMAs, well within L2's rate) but halves or thirds the
# passes over C, whose tiles are loaded, added to and stored once per k-block. AVX2 takes 384 (with
# the C prefetch; without it 384 gained nothing); AVX-512 per host (cpu_tuning.GEMM_KC_AVX512).
comptime KC = GEMM_KC_AVX512 if FW == 16 else 384
comptime MC = 100 if MR == 5 else 96  # m-block of packed x, MC x KC (48 / 144 KB), stays in L2; a multiple of MR
# n-block packed per task: KC x NC x 4 = 64 KB, or 192 KB with KC = 384 (L2 holds it beside x's
# block). 128 rather than 256: twice the tasks for the workers' shared counter, so a worker slowed by
# the host's other load takes fewer of them; 64 would add one more pass of each task over packed x
# (from L3) per halving.
comptime NC = 128

# Rows of x per GEMM pass (a multiple of MC). x is packed per pass, so the packed copy is at most
# SLAB_M x K floats (115 MB at Llama-3-8B's K = 14336) instead of a second copy of x for any M (a
# 32K-token prefill's down projection would have packed 1.9 GB). Each extra pass packs W once more:
# KC x NC values packed per SLAB_M x KC x NC FMAs, 1 / 2016 by operation count (not timed; no M
# up to 2016 changes).
comptime SLAB_M = 21 * MC


@always_inline
def _k_step(mut acc: Array[SIMD[F32, FW], MR * NV], a: Ptr[F32], b: Ptr[F32]):
    # One k of the micro-tile: acc[i][v] += a[i * FW] * b[v * FW : (v + 1) * FW]. a: the k's value of
    # each of the MR rows, FW apart in the packed micro-panel; b: the k's NR packed W values.
    var bv = Array[SIMD[F32, FW], NV](fill=SIMD[F32, FW](0))
    comptime for v in range(NV):
        bv[v] = b.unsafe_load[width=FW](v * FW)
    comptime for i in range(MR):
        var av = SIMD[F32, FW](a[unsafe_offset=i * FW])
        comptime for v in range(NV):
            acc[i * NV + v] = av.fma(bv[v], acc[i * NV + v])


@always_inline
def _micro_tile[first: Bool, full: Bool](
    a: Ptr[F32], bp: Ptr[F32], c: Ptr[F32], ldc: Int, kc: Int, rows: Int, cols: Int
):
    # c[0:rows, 0:cols] (+)= A[0:MR, 0:kc] @ bp[0:kc, 0:NR]. a: the packed micro-panel
    # [kc / FW][MR][FW] (rows past `rows` are zero; a partial last chunk holds kc % FW values per
    # row, still FW apart); bp: [kc][NR]. Whole chunks run unrolled by FW, so every broadcast has a
    # constant offset from the chunk.
    var acc = Array[SIMD[F32, FW], MR * NV](fill=SIMD[F32, FW](0))
    var kfull = kc - kc % FW
    var kk = 0
    while kk < kfull:
        var chunk = a.unsafe_offset(kk * MR)
        var bk = bp.unsafe_offset(kk * NR)
        comptime for k2 in range(FW):
            _k_step(acc, chunk.unsafe_offset(k2), bk.unsafe_offset(k2 * NR))
        kk += FW
    var tail = a.unsafe_offset(kfull * MR)
    for k in range(kfull, kc):
        _k_step(acc, tail.unsafe_offset(k - kfull), bp.unsafe_offset(k * NR))
    comptime if full:
        comptime for i in range(MR):
            comptime for v in range(NV):
                var p = c.unsafe_offset(i * ldc + v * FW)
                comptime if first:
                    p.unsafe_store(0, acc[i * NV + v])
                else:
                    p.unsafe_store(0, acc[i * NV + v] + p.unsafe_load[width=FW](0))
    else:
        comptime for i in range(MR):
            if i < rows:
                comptime for v in range(NV):
                    var p = c.unsafe_offset(i * ldc + v * FW)
                    var vec = acc[i * NV + v]
                    for j in range(min(FW, cols - v * FW)):
                        comptime if first:
                            p[unsafe_offset=j] = vec[j]
                        else:
                            p[unsafe_offset=j] = p[unsafe_offset=j] + vec[j]


@always_inline
def _pack_b[qtype: StaticString](
    w: BytePtr, row_bytes: Int, N: Int, n0: Int, nc: Int, k0: Int, kc: Int, bp: Ptr[F32]
):
    # bp[jr][k][j] = W[n0 + jr*NR + j, k0 + k], decoding `qtype` blocks in registers on the way (the
    # panel is the only float copy of the weights, KC x NC at a time). Columns past N are zero so edge
    # tiles stay finite. For quantized formats k0 and kc are multiples of the 32-value block.
    # Full panels are transposed in registers by FW x FW tiles (16 x 16 with AVX-512, 8 x 8 with
    # AVX2) instead of scalar stores; edge panels take the scalar loop at the end.
    for jr in range(ceil_div(nc, NR)):
        var panel = bp.unsafe_offset(jr * KC * NR)
        var full = n0 + jr * NR + NR <= N
        comptime if qtype == "f32":
            if full and kc % FW == 0:
                for jb in range(NR // FW):
                    var src = w.unsafe_offset((n0 + jr * NR + jb * FW) * row_bytes).unsafe_bitcast[Float32]().unsafe_offset(k0)
                    for kb in range(kc // FW):
                        var t = Array[SIMD[F32, FW], FW](fill=SIMD[F32, FW](0))
                        comptime for jj in range(FW):
                            t[jj] = src.unsafe_load[width=FW](jj * (row_bytes // 4) + kb * FW)
                        transpose_tile[FW](t)
                        comptime for kk in range(FW):
                            panel.unsafe_store((kb * FW + kk) * NR + jb * FW, t[kk])
                continue
        else:
            # Block formats: each FW-row group decodes one block per row and transposes it by FW-value
            # pieces (a block is two 16-value halves: one piece each with AVX-512, two with AVX2).
            if full:
                for jb in range(NR // FW):
                    var rows0 = w.unsafe_offset((n0 + jr * NR + jb * FW) * row_bytes)
                    for b in range(kc // QBLOCK):
                        comptime for h in range(2):
                            var half = Array[SIMD[F32, HALF], FW](fill=SIMD[F32, HALF](0))
                            comptime for jj in range(FW):
                                half[jj] = decode_chunk[qtype](rows0.unsafe_offset(jj * row_bytes), k0 // QBLOCK + b)[h]
                            comptime for q in range(HALF // FW):
                                var t = Array[SIMD[F32, FW], FW](fill=SIMD[F32, FW](0))
                                comptime for jj in range(FW):
                                    t[jj] = half[jj].slice[FW, offset=q * FW]()
                                transpose_tile[FW](t)
                                comptime for kk in range(FW):
                                    panel.unsafe_store((b * QBLOCK + h * HALF + q * FW + kk) * NR + jb * FW, t[kk])
                continue
        for j in range(NR):
            var n = n0 + jr * NR + j
            if n >= N:
                for k in range(kc):
                    panel[unsafe_offset=k * NR + j] = 0
                continue
            comptime if qtype == "f32":
                var src = w.unsafe_offset(n * row_bytes).unsafe_bitcast[Float32]().unsafe_offset(k0)
                for k in range(kc):
                    panel[unsafe_offset=k * NR + j] = src[unsafe_offset=k]
            else:
                var row = w.unsafe_offset(n * row_bytes)
                for b in range(kc // QBLOCK):
                    var v = decode_chunk[qtype](row, k0 // QBLOCK + b)
                    var dst = panel.unsafe_offset(b * QBLOCK * NR + j)
                    comptime for i in range(HALF):
                        dst[unsafe_offset=i * NR] = v[0][i]
                        dst[unsafe_offset=(i + HALF) * NR] = v[1][i]


@always_inline
def _pack_a(x: Ptr[F32], K: Int, m0: Int, m_end: Int, tiles: Int, k0: Int, kc: Int, ap: Ptr[F32]):
    # ap[t][k // FW][i][k % FW] = x[m0 + t*MR + i, k0 + k] for t < tiles, zero for rows at or past
    # m_end: per FW-value k-chunk the tile's MR row pieces lie side by side (MR x FW floats).
    for t in range(tiles):
        var dst = ap.unsafe_offset(t * MR * KC)
        for i in range(MR):
            var row = m0 + t * MR + i
            var live = row < m_end
            # A dead row's source is never read; clamping keeps its address inside x.
            var src = x.unsafe_offset(min(row, m_end - 1) * K + k0)
            var c = 0
            while c + FW <= kc:
                var v = src.unsafe_load[width=FW](c) if live else SIMD[F32, FW](0)
                dst.unsafe_store(c * MR + i * FW, v)
                c += FW
            for j in range(kc - c):
                dst[unsafe_offset=c * MR + i * FW + j] = src[unsafe_offset=c + j] if live else 0


def gemm_cpu[qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, M: Int, N: Int, K: Int, ctx: DeviceContext, ldy: Int
) raises:
    """Blocked GEMM with fp32 compute; W rows are `row_bytes` apart in format `qtype` ("f32" or a GGUF
    block format, K a multiple of 32 then). Any M, N, K >= 1.

    Runs M in slabs of at most SLAB_M rows, so the packed copy of x stays bounded (see SLAB_M).
    """
    var m0 = 0
    while m0 < M:
        var rows = min(SLAB_M, M - m0)
        _gemm_slab[qtype](y.unsafe_offset(m0 * ldy), x.unsafe_offset(m0 * K), w, row_bytes, rows, N, K, ctx, ldy)
        m0 += rows


def _gemm_slab[qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, M: Int, N: Int, K: Int, ctx: DeviceContext, ldy: Int
) raises:
    # y: [M, N] with rows ldy apart, x: [M, K] (one slab of rows), W: [N, K] as `row_bytes`-byte rows.
    var n_blocks = ceil_div(N, NC)
    var m_tiles = ceil_div(M, MR)
    var k_blocks = ceil_div(K, KC)
    # Few n-blocks (small N) would leave cores idle: split M as well (re-packing B per chunk).
    var m_chunks = max(1, min(m_tiles, ceil_div(2 * cpu_threads(), n_blocks)))
    var tiles_per_chunk = ceil_div(m_tiles, m_chunks)
    # x packed once per call, ap[k-block][tile][k][MR] (x's size, padded to whole tiles and k-blocks),
    # by its own parallel pass: packing it inside each n-block task did the same work once per n-block.
    var ap = scratch[F32](k_blocks * m_tiles * MR * KC)
    var pack_chunks = min(m_tiles, 2 * cpu_threads())
    var tiles_per_pack = ceil_div(m_tiles, pack_chunks)

    def pack_task(t: Int) {var x, var M, var K, var m_tiles, var k_blocks, var tiles_per_pack, var ap}:
        var kb = t % k_blocks
        var t0 = (t // k_blocks) * tiles_per_pack
        var t1 = min(m_tiles, t0 + tiles_per_pack)
        if t0 < t1:
            _pack_a(x, K, t0 * MR, M, t1 - t0, kb * KC, min(KC, K - kb * KC),
                    ap.unsafe_offset((kb * m_tiles + t0) * MR * KC))

    parallel_for(pack_task, k_blocks * pack_chunks, ctx)

    def task(t: Int) {var y, var w, var row_bytes, var M, var N, var K, var ldy, var n_blocks, var tiles_per_chunk, var m_tiles,
                      var ap}:
        var nb = t % n_blocks
        var mc = t // n_blocks
        var n0 = nb * NC
        var nc = min(NC, N - n0)
        var m_begin = mc * tiles_per_chunk * MR
        var m_end = min(M, m_begin + tiles_per_chunk * MR)
        if m_begin >= m_end:
            return
        var tiles = ceil_div(m_end - m_begin, MR)
        var bp = scratch[F32](KC * NC)
        var k0 = 0
        while k0 < K:
            var kc = min(KC, K - k0)
            _pack_b[qtype](w, row_bytes, N, n0, nc, k0, kc, bp)
            var a_block = ap.unsafe_offset(((k0 // KC) * m_tiles + m_begin // MR) * MR * KC)
            var t0 = 0
            while t0 < tiles:
                # One MC x kc block of packed x (in L2) meets each NR-column panel of bp (in L1).
                var t1 = min(tiles, t0 + MC // MR)
                for jr in range(ceil_div(nc, NR)):
                    var cols = min(NR, nc - jr * NR)
                    var panel = bp.unsafe_offset(jr * KC * NR)
                    var cbase = y.unsafe_offset(n0 + jr * NR)
                    for tt in range(t0, t1):
                        var a = a_block.unsafe_offset(tt * MR * KC)
                        var i = m_begin + tt * MR
                        var rows = min(MR, m_end - i)
                        # The C tile's lines, requested before the FMAs: C (M x NC) does not stay in L2
                        # between k-blocks, and its load at the end would otherwise stall on L3.
                        comptime for r in range(MR):
                            comptime for line in range(NR // 16):
                                prefetch[PrefetchOptions().for_write().high_locality()](
                                    cbase.unsafe_offset((i + min(r, rows - 1)) * ldy + line * 16).unsafe_bitcast[UInt8]())
                        if cols == NR and rows == MR:
                            if k0 == 0:
                                _micro_tile[True, True](a, panel, cbase.unsafe_offset(i * ldy), ldy, kc, MR, cols)
                            else:
                                _micro_tile[False, True](a, panel, cbase.unsafe_offset(i * ldy), ldy, kc, MR, cols)
                        else:
                            if k0 == 0:
                                _micro_tile[True, False](a, panel, cbase.unsafe_offset(i * ldy), ldy, kc, rows, cols)
                            else:
                                _micro_tile[False, False](a, panel, cbase.unsafe_offset(i * ldy), ldy, kc, rows, cols)
                t0 = t1
            k0 += KC
        bp.unsafe_free()

    parallel_for(task, n_blocks * m_chunks, ctx)
    ap.unsafe_free()
