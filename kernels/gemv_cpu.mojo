# CPU GEMV: y[M, N] = x[M, K] @ W[N, K]^T for M <= 8 (decode; larger M runs in groups of 8), fp32.
#
# Memory-bound: streams each weight row once, dotting it with all rows of x held near L1. R rows
# of W are in flight at once (R load streams, MROWS*R accumulators). Software prefetch of the weight
# rows is per host (cpu_tuning.GEMV_PREFETCH_GROUPS).

from max.gpu.host import DeviceContext
from std.sys import PrefetchOptions, prefetch

from .common import FW, F32, Ptr, ceil_div, cpu_threads, parallel_for
from .cpu_tuning import GEMV_PREFETCH_GROUPS

comptime GEMV_MAX_M = 8


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
            # The same k range GEMV_PREFETCH_GROUPS row groups ahead: a group's rows are R short
            # streams (2.3 KB each at K = 576) that the hardware prefetchers restart on every group.
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
