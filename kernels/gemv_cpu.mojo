# CPU GEMV: y[M, N] = x[M, K] @ W[N, K]^T for M <= 8 (decode; larger M runs in groups of 8), fp32.
#
# Memory-bound: streams each weight row once, dotting it with all rows of x held near L1. R rows
# of W are in flight at once (R load streams, MROWS*R accumulators).
# Software prefetch measured no gain on 4096 x 4096 and cost 6 us per 576 x 1536 op in a chain
# (62 -> 68 us) on the first AVX-512 host; on Zen 4 it gains (GEMV_PREFETCH_GROUPS).

from max.gpu.host import DeviceContext
from std.sys import PrefetchOptions, prefetch
from std.sys.info import CompilationTarget

from .common import FW, F32, Ptr, ceil_div, cpu_threads, parallel_for

comptime GEMV_MAX_M = 8
# The gemv prefetches the weight rows this many row groups (of R rows) ahead, the same k range: a
# group's rows are R short streams (2.3 KB each at K = 576) that the hardware prefetchers restart
# on every group. Zen 4 (memory 20-33 GB/s, noisy), standalone gemv_cpu, 3 alternating runs,
# medians: 576 x 1536 over 20 copies from DRAM 163-196 -> 133-153 us per op (1 group ahead
# 139-158, 4 groups 147-162); 4096 x 4096 over 4 copies 2479-2645 -> 2184-2268 us. The first
# AVX-512 host (Zen 5 class) measured no gain at 4096 x 4096 and a loss at 576 x 1536 (chain 62
# -> 68 us per op, see the header), so other targets keep the hardware prefetchers alone. In a
# graph (chains of copies, 6 interleaved rounds, us per op): 576 x 1536 156.7-194.4 -> 116.3-143.0
# (MAX 179.0-210.4), faster in 6 of 6; 4096 x 4096 2004-2293 -> 1948-2206 (4 of 5; MAX 3564-4203).
# Zen 3 (2026-12-04), chains of 4096 x 4096 copies, 8 interleaved rounds, medians per op: 2 groups
# ahead 2100.8 -> 2270.9 us (faster in 0 of 8); R = 2 or 1 weight rows per step at M = 1 instead of
# 4: 2433.2 -> 2538.1 / 3013.0 us (1 of 8 together). Neither is taken there.
comptime GEMV_PREFETCH_GROUPS = 2 if CompilationTarget._is_arch["znver4"]() else 0


@always_inline
def _gemv_rows[MROWS: Int, R: Int, accumulate: Bool](
    x: Ptr[F32], w: Ptr[F32], y: Ptr[F32], n0: Int, N: Int, K: Int, k0: Int, k1: Int
):
    # y[m, n0:n0+R] (+)= x[m, k0:k1] . W[n0:n0+R, k0:k1] for m < MROWS: R weight rows streamed together.
    var acc = Array[SIMD[F32, FW], MROWS * R](fill=SIMD[F32, FW](0))
    var k = k0
    while k + FW <= k1:
        # Load the R weight vectors once, then each x vector once: R + MROWS loads per R * MROWS FMAs.
        var wv = Array[SIMD[F32, FW], R](fill=SIMD[F32, FW](0))
        comptime for r in range(R):
            comptime if GEMV_PREFETCH_GROUPS > 0:
                prefetch[PrefetchOptions().for_read().medium_locality()](
                    w.unsafe_offset((n0 + r + GEMV_PREFETCH_GROUPS * R) * K + k).unsafe_bitcast[UInt8]())
            wv[r] = w.unsafe_load[width=FW]((n0 + r) * K + k)
        comptime for m in range(MROWS):
            var xv = x.unsafe_load[width=FW](m * K + k)
            comptime for r in range(R):
                acc[m * R + r] = xv.fma(wv[r], acc[m * R + r])
        k += FW
    comptime for m in range(MROWS):
        comptime for r in range(R):
            var s = acc[m * R + r].reduce_add()
            for kk in range(k, k1):
                s += x[unsafe_offset=m * K + kk] * w[unsafe_offset=(n0 + r) * K + kk]
            comptime if accumulate:
                s += y[unsafe_offset=m * N + n0 + r]
            y[unsafe_offset=m * N + n0 + r] = s


def _gemv_m[MROWS: Int](y: Ptr[F32], x: Ptr[F32], w: Ptr[F32], N: Int, K: Int, ctx: DeviceContext) raises:
    # 4 weight rows in flight for M <= 4 (16 accumulators max), 2 for M <= 8, within 32 registers.
    comptime R = 4 if MROWS <= 4 else 2
    # K is split so the MROWS x rows of one k-block stay near L1 while W streams past them; blocks
    # stay >= 8 KB of each weight row so the hardware prefetcher keeps up with the row segments.
    comptime KB = max(2048, 8192 // MROWS)
    # Tiny problems are dominated by the thread hand-off: run them on the calling thread.
    var tasks = 1 if N * K < 32768 else cpu_threads() * 2
    var per = ceil_div(ceil_div(N, tasks), R) * R

    def task(t: Int) {var y, var x, var w, var N, var K, var per}:
        var begin = t * per
        var end = min(N, begin + per)
        var k0 = 0
        while k0 < K:
            var k1 = min(K, k0 + KB)
            var n = begin
            if k0 == 0:
                while n + R <= end:
                    _gemv_rows[MROWS, R, False](x, w, y, n, N, K, k0, k1)
                    n += R
                while n < end:
                    _gemv_rows[MROWS, 1, False](x, w, y, n, N, K, k0, k1)
                    n += 1
            else:
                while n + R <= end:
                    _gemv_rows[MROWS, R, True](x, w, y, n, N, K, k0, k1)
                    n += R
                while n < end:
                    _gemv_rows[MROWS, 1, True](x, w, y, n, N, K, k0, k1)
                    n += 1
            k0 = k1

    if tasks == 1:
        task(0)
    else:
        parallel_for(task, tasks, ctx)


def gemv_cpu(y: Ptr[F32], x: Ptr[F32], w: Ptr[F32], M: Int, N: Int, K: Int, ctx: DeviceContext) raises:
    """Decode-shaped matmul: one pass over W per group of up to 8 rows of x (any M >= 1)."""
    var m0 = 0
    while m0 < M:
        var rows = min(GEMV_MAX_M, M - m0)
        var xs = x.unsafe_offset(m0 * K)
        var ys = y.unsafe_offset(m0 * N)
        comptime for m in range(1, GEMV_MAX_M + 1):
            if rows == m:
                _gemv_m[m](ys, xs, w, N, K, ctx)
        m0 += rows
