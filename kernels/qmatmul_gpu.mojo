# GPU quantized matmul: y[M, N] = x[M, K] @ dequant(Wq)^T, Wq rows of GGUF blocks (quant.mojo).
#
# One warp per weight row n and per group of up to 8 rows of x: lane l decodes blocks l, l + WARP_SIZE, ...
# of row n in registers (never to memory), dots each with the 8 x rows, and the warp reduces. Decode
# (M <= 8) reads every weight byte exactly once; prefill reads them ceil(M / 8) times, which is the
# simple, correct baseline (a tensor-core dequant-GEMM is the next step for long prompts).

from max.gpu import WARP_SIZE, block_idx, lane_id, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.primitives.warp import sum as warp_sum

from .common import BytePtr, F32, Ptr, ceil_div
from .quant import QBLOCK, block_bytes, decode_value

comptime MGROUP = 8       # x rows per warp
comptime WARPS = 4        # weight rows (warps) per block


def _qmatmul_kernel[dtype: DType, qtype: StaticString](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int32, N: Int32, K: Int32
):
    comptime bb = block_bytes[qtype]()
    var lane = Int(lane_id())
    var n = Int(block_idx.x) * WARPS + Int(thread_idx.x) // WARP_SIZE
    var m0 = Int(block_idx.y) * MGROUP
    var m_ = Int(M)
    var k_ = Int(K)
    if n >= Int(N):
        return
    var rows = min(MGROUP, m_ - m0)
    var nblocks = k_ // QBLOCK
    var row = w.unsafe_offset(n * nblocks * bb)
    var acc = Array[Float32, MGROUP](fill=0)
    var b = lane
    while b < nblocks:
        var blk = row.unsafe_offset(b * bb)
        for i in range(QBLOCK):
            var v = decode_value[qtype](blk, i)
            var k = b * QBLOCK + i
            comptime for m in range(MGROUP):
                if m < rows:
                    acc[m] += v * x[unsafe_offset=(m0 + m) * k_ + k].cast[F32]()
        b += WARP_SIZE
    comptime for m in range(MGROUP):
        var s = warp_sum(acc[m])
        if lane == 0 and m < rows:
            y[unsafe_offset=(m0 + m) * Int(N) + n] = s.cast[dtype]()


def qmatmul_gpu[dtype: DType, qtype: StaticString](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    """Launches one warp per (weight row, group of 8 x rows)."""
    ctx.enqueue_function[_qmatmul_kernel[dtype, qtype]](
        y, x, w, Int32(M), Int32(N), Int32(K),
        grid_dim=(ceil_div(N, WARPS), ceil_div(M, MGROUP)), block_dim=WARPS * WARP_SIZE,
    )
