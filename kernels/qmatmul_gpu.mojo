# GPU quantized matmul: y[M, N] = x[M, K] @ dequant(Wq)^T, Wq rows of GGUF blocks (quant.mojo).
#
# One warp per weight row n and per group of up to 8 rows of x: lane l decodes blocks l, l + WARP_SIZE, ...
# of row n in registers (never to memory), whole blocks at a time (decode_block: the scale read once,
# the quant bytes as one vector), dots each with the 8 x rows, and the warp reduces. Decode (M <= 8)
# reads every weight byte exactly once; prefill reads them ceil(M / 8) times, which is the simple,
# correct baseline (a tensor-core dequant-GEMM is the next step for long prompts).
#
# Variant (compile-time XVEC): x is read in 16-value vectors with 16-byte alignment when x's base
# address allows it (K is a multiple of 32, so every block's slice of a row is then aligned), else
# element by element. Whole blocks per lane replaced one value at a time (which re-read the block's
# scale for each value); Q8_0 lost with it (32 byte loads and 64 live floats per lane). All formats
# read far below the GPU's memory rate: one lane per 18-34-byte block spreads each warp load over 32
# blocks. Next: lanes sharing a block.

from std.sys import size_of
from max.gpu import WARP_SIZE, block_idx, lane_id, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.primitives.warp import sum as warp_sum

from .common import BytePtr, F32, Ptr, ceil_div
from .quant import HALF, QBLOCK, decode_chunk, row_bytes_of

comptime MGROUP = 8       # x rows per warp
comptime WARPS = 4        # weight rows (warps) per block


def _qmatmul_kernel[dtype: DType, qtype: StaticString, X_ALIGN: Int](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int32, N: Int32, K: Int32
):
    # y: [M, N]; x: [M, K]; w: [N, K / 32 * block_bytes] bytes.
    var lane = Int(lane_id())
    var n = Int(block_idx.x) * WARPS + Int(thread_idx.x) // WARP_SIZE
    var m0 = Int(block_idx.y) * MGROUP
    var m_ = Int(M)
    var k_ = Int(K)
    if n >= Int(N):
        return
    var rows = min(MGROUP, m_ - m0)
    var nblocks = k_ // QBLOCK
    var row = w.unsafe_offset(n * row_bytes_of[qtype](k_))
    var acc = Array[Float32, MGROUP](fill=0)
    var b = lane
    while b < nblocks:
        var vals = decode_chunk[qtype](row, b)   # (values 0..15, values 16..31)
        comptime for m in range(MGROUP):
            if m < rows:
                var xp = x.unsafe_offset((m0 + m) * k_ + b * QBLOCK)
                var x0 = xp.unsafe_load[width=HALF, alignment=X_ALIGN](0).cast[F32]()
                var x1 = xp.unsafe_load[width=HALF, alignment=X_ALIGN](HALF).cast[F32]()
                acc[m] += vals[1].fma(x1, vals[0] * x0).reduce_add()
        b += WARP_SIZE
    comptime for m in range(MGROUP):
        var s = warp_sum(acc[m])
        if lane == 0 and m < rows:
            y[unsafe_offset=(m0 + m) * Int(N) + n] = s.cast[dtype]()


def qmatmul_gpu[dtype: DType, qtype: StaticString](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    """Launches one warp per (weight row, group of 8 x rows)."""
    # decode_block reads the header as halves (Q4_1: one 4-byte pair) at the block start; every block
    # start is even (block sizes 18 to 210 are even), and 4-aligned for Q4_1, when the buffer start is.
    if Int(w) % 4 != 0:
        raise Error("crucible.qmatmul on GPU: the weight buffer must start 4-byte aligned")
    var grid = (ceil_div(N, WARPS), ceil_div(M, MGROUP))
    if Int(x) % 16 == 0:
        ctx.enqueue_function[_qmatmul_kernel[dtype, qtype, 16]](
            y, x, w, Int32(M), Int32(N), Int32(K), grid_dim=grid, block_dim=WARPS * WARP_SIZE,
        )
    else:
        ctx.enqueue_function[_qmatmul_kernel[dtype, qtype, size_of[dtype]()]](
            y, x, w, Int32(M), Int32(N), Int32(K), grid_dim=grid, block_dim=WARPS * WARP_SIZE,
        )
