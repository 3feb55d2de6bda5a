# CPU quantized matmul: y[M, N] = x[M, K] @ dequant(Wq)^T, Wq rows of GGUF blocks (quant.mojo).
#
#   qgemv  M <= 32 (decode, and batched decode up to 32 sequences). Memory-bound on the quantized
#          bytes: R weight rows are streamed together, each block decoded once in registers. For M = 1
#          the block's scale multiplies the combined products (Q4: per-block offset via x's block
#          sums; Q8_0/F16: dot_block); for M > 1 the block is decoded to floats once and reused by up
#          to 8 rows; M > 8 runs in groups of 8 rows, each streaming the weights again.
#   gemm   M > 32 (prefill). The fp32 GEMM of matmul_cpu.mojo with a packing step that decodes blocks
#          into the KC x NR micro-panel; the float weights never exist beyond that panel.
# Why 32: decode steps of SmolLM2 measured 17 ms at 8 sequences but 54 ms at 9 through the GEMM
# (packing decodes every block into memory and small M cannot amortize it); groups of 8 cost one
# weight pass per group, which stays cheaper than the GEMM up to about 32 rows (16 sequences:
# 58 -> 30 ms; 32: 76 -> 60 ms). One pass of 16 rows (R = 1) measured slower than two of 8.

from max.gpu.host import DeviceContext

from .common import BytePtr, F32, Ptr, ceil_div, cpu_threads, load_f16_as_f32, parallel_for, scratch
from .matmul_cpu import GEMV_MAX_M, gemm_cpu

comptime QGEMV_MAX_M = 32
from .quant import HALF, QBLOCK, block_bytes, decode_block, dot_block


@always_inline
def _qgemv_rows[MROWS: Int, R: Int, qtype: StaticString](
    x: Ptr[F32], xsum: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n0: Int, N: Int, K: Int
):
    # y[m, n0:n0+R] = x[m, :] . dequant(W[n0:n0+R, :]) for m < MROWS. xsum[b] = sum of x[0, block b].
    comptime bb = block_bytes[qtype]()
    var acc = Array[SIMD[F32, HALF], MROWS * R](fill=SIMD[F32, HALF](0))
    comptime if MROWS == 1 and (qtype == "q4_0" or qtype == "q4_1"):
        # Decode fast path: nibbles are used unsigned and the block's offset term (-8 d for Q4_0, m for
        # Q4_1) is applied once per block through the block sum of x, as a scalar. Per block and row:
        # 2 conversions, 1 multiply, 2 FMAs; the scale multiplies the combined products once.
        comptime head = 2 if qtype == "q4_0" else 4
        var offset = Array[Float32, R](fill=0)
        for b in range(K // QBLOCK):
            var x0 = x.unsafe_load[width=HALF](b * QBLOCK)
            var x1 = x.unsafe_load[width=HALF](b * QBLOCK + HALF)
            var sb = xsum[unsafe_offset=b]
            comptime for r in range(R):
                var blk = w.unsafe_offset((n0 + r) * row_bytes + b * bb)
                var q = blk.unsafe_offset(head).unsafe_load[width=HALF](0)
                var t = (q >> 4).cast[F32]().fma(x1, (q & 0xF).cast[F32]() * x0)
                var d = load_f16_as_f32(blk)
                acc[r] = t.fma(SIMD[F32, HALF](d), acc[r])
                comptime if qtype == "q4_0":
                    offset[r] -= 8.0 * d * sb
                else:
                    offset[r] += load_f16_as_f32(blk.unsafe_offset(2)) * sb
        comptime for r in range(R):
            y[unsafe_offset=n0 + r] = acc[r].reduce_add() + offset[r]
        return
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
    # Block sums of the (first) x row, for the Q4 decode path's offset term.
    var xsum = scratch[F32](K // QBLOCK)
    for b in range(K // QBLOCK):
        xsum[unsafe_offset=b] = (x.unsafe_load[width=HALF](b * QBLOCK) + x.unsafe_load[width=HALF](b * QBLOCK + HALF)).reduce_add()

    def task(t: Int) {var y, var x, var xsum, var w, var row_bytes, var N, var K, var per}:
        var n = t * per
        var end = min(N, n + per)
        while n + R <= end:
            _qgemv_rows[MROWS, R, qtype](x, xsum, w, row_bytes, y, n, N, K)
            n += R
        while n < end:
            _qgemv_rows[MROWS, 1, qtype](x, xsum, w, row_bytes, y, n, N, K)
            n += 1

    if tasks == 1:
        task(0)
    else:
        parallel_for(task, tasks, ctx)
    xsum.unsafe_free()


def qmatmul_cpu[qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    """y = x @ dequant(w)^T; K must be a multiple of 32 (checked by the op)."""
    var row_bytes = (K // QBLOCK) * block_bytes[qtype]()
    if M > QGEMV_MAX_M:
        gemm_cpu[qtype](y, x, w, row_bytes, M, N, K, ctx)
        return
    var m0 = 0
    while m0 < M:
        # Balanced groups (M = 9 runs 5 + 4, not 8 + 1): fewer rows per pass cost a little less.
        var groups = ceil_div(M - m0, GEMV_MAX_M)
        var rows = ceil_div(M - m0, groups)
        comptime for m in range(1, GEMV_MAX_M + 1):
            if rows == m:
                _qgemv_m[m, qtype](y + m0 * N, x + m0 * K, w, row_bytes, N, K, ctx)
        m0 += rows
