# CPU quantized matmul: y[M, N] = x[M, K] @ dequant(Wq)^T, Wq rows of GGUF blocks (quant.mojo).
#
#   qgemv  M <= 8 (decode). Memory-bound on the quantized bytes: R weight rows are streamed together,
#          each block decoded once in registers. For M = 1 the block's scale multiplies the combined
#          products (dot_block); for M > 1 the block is decoded to floats once and reused by all rows.
#   gemm   M > 8 (prefill). The fp32 GEMM of matmul_cpu.mojo with a packing step that decodes blocks
#          into the KC x NR micro-panel; the float weights never exist beyond that panel.

from max.gpu.host import DeviceContext

from .common import BytePtr, F32, Ptr, ceil_div, cpu_threads, parallel_for
from .matmul_cpu import GEMV_MAX_M, gemm_cpu
from .quant import HALF, QBLOCK, block_bytes, decode_block, dot_block


@always_inline
def _qgemv_rows[MROWS: Int, R: Int, qtype: StaticString](
    x: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n0: Int, N: Int, K: Int
):
    # y[m, n0:n0+R] = x[m, :] . dequant(W[n0:n0+R, :]) for m < MROWS.
    comptime bb = block_bytes[qtype]()
    var acc = Array[SIMD[F32, HALF], MROWS * R](fill=SIMD[F32, HALF](0))
    for b in range(K // QBLOCK):
        comptime if MROWS == 1:
            var x0 = x.unsafe_load[width=HALF](b * QBLOCK)
            var x1 = x.unsafe_load[width=HALF](b * QBLOCK + HALF)
            comptime for r in range(R):
                acc[r] += dot_block[qtype](w.unsafe_offset((n0 + r) * row_bytes + b * bb), x0, x1)
        else:
            comptime for r in range(R):
                var v = decode_block[qtype](w.unsafe_offset((n0 + r) * row_bytes + b * bb))
                comptime for m in range(MROWS):
                    var x0 = x.unsafe_load[width=HALF](m * K + b * QBLOCK)
                    var x1 = x.unsafe_load[width=HALF](m * K + b * QBLOCK + HALF)
                    acc[m * R + r] = v[1].fma(x1, v[0].fma(x0, acc[m * R + r]))
    comptime for m in range(MROWS):
        comptime for r in range(R):
            y[unsafe_offset=m * N + n0 + r] = acc[m * R + r].reduce_add()


def _qgemv_m[MROWS: Int, qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    comptime R = 4 if MROWS <= 2 else 2
    var tasks = 1 if N * row_bytes < 65536 else cpu_threads() * 2
    var per = ceil_div(ceil_div(N, tasks), R) * R

    def task(t: Int) {var y, var x, var w, var row_bytes, var N, var K, var per}:
        var n = t * per
        var end = min(N, n + per)
        while n + R <= end:
            _qgemv_rows[MROWS, R, qtype](x, w, row_bytes, y, n, N, K)
            n += R
        while n < end:
            _qgemv_rows[MROWS, 1, qtype](x, w, row_bytes, y, n, N, K)
            n += 1

    if tasks == 1:
        task(0)
    else:
        parallel_for(task, tasks, ctx)


def qmatmul_cpu[qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    """y = x @ dequant(w)^T; K must be a multiple of 32 (checked by the op)."""
    var row_bytes = (K // QBLOCK) * block_bytes[qtype]()
    if M > GEMV_MAX_M:
        gemm_cpu[qtype](y, x, w, row_bytes, M, N, K, ctx)
        return
    comptime for m in range(1, GEMV_MAX_M + 1):
        if M == m:
            _qgemv_m[m, qtype](y, x, w, row_bytes, N, K, ctx)
            return
