# GPU quantized matmul: y[M, N] = x[M, K] @ dequant(Wq)^T, Wq rows of GGUF blocks (quant.mojo).
#
# One warp per weight row n and per group of up to 8 rows of x; the warp reduces its lanes' sums. Decode
# (M <= 8) reads every weight byte once; prefill reads them ceil(M / 8) times (a tensor-core
# dequant-GEMM is the next step for long prompts). Blocks are decoded in registers, never to memory.
#
# Variants (the op's `variant` parameter; "auto" is lanes until staged has been timed on a GPU):
#   lanes   lane l decodes 32-value chunks l, l + 32, ... straight from global memory (decode_chunk).
#           One lane per 18-210-byte block spreads each warp load over 32 blocks: measured at 4-6% of
#           an H200's read rate.
#   staged  the warp first copies the next 64 chunks' bytes of its row to shared memory in 16-byte
#           vectors, coalesced (a row's bytes are contiguous whatever the format), then each lane
#           decodes its chunks from there. Every format gets full-width loads without per-format code.
# Both read x in 16-value vectors with 16-byte alignment when x's base address allows it (XVEC), else
# element by element.

from std.memory import stack_allocation
from std.sys import size_of
from max.gpu import WARP_SIZE, block_idx, lane_id, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import sum as warp_sum
from max.gpu.sync import syncwarp

from .common import BytePtr, F32, Ptr, ceil_div
from .quant import HALF, QBLOCK, chunk_offset, decode_chunk, row_bytes_of

comptime MGROUP = 8       # x rows per warp
comptime WARPS = 4        # weight rows (warps) per block
comptime STAGE = 64       # 32-value chunks a warp stages per step (staged): 2 per lane, 8 K-quant blocks
comptime VEC = 16         # bytes per staging load


def _lanes_kernel[dtype: DType, qtype: StaticString, X_ALIGN: Int](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int32, N: Int32, K: Int32, LDY: Int32
):
    # y: [M, N], rows LDY apart; x: [M, K]; w: [N, K / 32 * block_bytes] bytes.
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
            y[unsafe_offset=(m0 + m) * Int(LDY) + n] = s.cast[dtype]()


def _staged_kernel[dtype: DType, qtype: StaticString, X_ALIGN: Int](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int32, N: Int32, K: Int32, LDY: Int32
):
    # y: [M, N], rows LDY apart; x: [M, K]; w: [N, row_bytes] bytes, its base 16-byte aligned (checked at launch).
    # A warp's slot holds one step's bytes from the 16-byte boundary at or below their start, so a
    # block keeps its alignment modulo 16 in shared memory (Q4_1 reads its header as one 4-byte pair).
    comptime TILE_BYTES = chunk_offset[qtype](STAGE)
    comptime SLOT = ceil_div(TILE_BYTES + 2 * VEC, VEC) * VEC
    comptime LOADS = ceil_div(SLOT // VEC, WARP_SIZE)  # vectors each lane loads per step
    var smem = stack_allocation[WARPS * SLOT, UInt8, address_space=AddressSpace.SHARED, alignment=VEC]()
    var lane = Int(lane_id())
    var warp = Int(thread_idx.x) // WARP_SIZE
    var n = Int(block_idx.x) * WARPS + warp
    var m0 = Int(block_idx.y) * MGROUP
    var m_ = Int(M)
    var k_ = Int(K)
    if n >= Int(N):
        return
    var slot = smem.unsafe_offset(warp * SLOT)
    var slot_g = rebind[BytePtr](slot.unsafe_address_space_cast[AddressSpace.GENERIC]())
    var rows = min(MGROUP, m_ - m0)
    var nchunks = k_ // QBLOCK
    var row_bytes = row_bytes_of[qtype](k_)
    var total = Int(N) * row_bytes
    var row0 = n * row_bytes
    var acc = Array[Float32, MGROUP](fill=0)
    var c0 = 0
    while c0 < nchunks:
        var cn = min(STAGE, nchunks - c0)   # a multiple of 8 for K-quants (K is a multiple of 256)
        var start = row0 + chunk_offset[qtype](c0)
        var end = row0 + chunk_offset[qtype](c0 + cn)
        var a = start - start % VEC
        var nvec = ceil_div(end - a, VEC)
        # All loads of the step are issued before any store, so they are in flight together.
        var regs = Array[SIMD[DType.uint8, VEC], LOADS](fill=SIMD[DType.uint8, VEC](0))
        comptime for r in range(LOADS):
            var v = lane + r * WARP_SIZE
            var g = a + v * VEC
            if v < nvec:
                if g + VEC <= total:
                    regs[r] = w.unsafe_offset(g).unsafe_load[width=VEC, alignment=VEC](0)
                else:  # the buffer's last bytes: no read past its end
                    for i in range(VEC):
                        if g + i < total:
                            regs[r][i] = w[unsafe_offset=g + i]
        comptime for r in range(LOADS):
            var v = lane + r * WARP_SIZE
            if v < nvec:
                slot.unsafe_offset(v * VEC).unsafe_store[alignment=VEC](0, regs[r])
        syncwarp()
        var base = slot_g.unsafe_offset(start - a)
        comptime for j in range(STAGE // WARP_SIZE):
            var c = lane + j * WARP_SIZE
            if c < cn:
                var vals = decode_chunk[qtype](base, c)   # c0 is a multiple of 8: K-quant subs line up
                comptime for m in range(MGROUP):
                    if m < rows:
                        var xp = x.unsafe_offset((m0 + m) * k_ + (c0 + c) * QBLOCK)
                        var x0 = xp.unsafe_load[width=HALF, alignment=X_ALIGN](0).cast[F32]()
                        var x1 = xp.unsafe_load[width=HALF, alignment=X_ALIGN](HALF).cast[F32]()
                        acc[m] += vals[1].fma(x1, vals[0] * x0).reduce_add()
        syncwarp()  # every lane is done with the slot before the next step overwrites it
        c0 += STAGE
    comptime for m in range(MGROUP):
        var s = warp_sum(acc[m])
        if lane == 0 and m < rows:
            y[unsafe_offset=(m0 + m) * Int(LDY) + n] = s.cast[dtype]()


def _launch[dtype: DType, qtype: StaticString, staged: Bool, X_ALIGN: Int](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext, ldy: Int
) raises:
    var grid = (ceil_div(N, WARPS), ceil_div(M, MGROUP))
    comptime if staged:
        ctx.enqueue_function[_staged_kernel[dtype, qtype, X_ALIGN]](
            y, x, w, Int32(M), Int32(N), Int32(K), Int32(ldy), grid_dim=grid, block_dim=WARPS * WARP_SIZE,
        )
    else:
        ctx.enqueue_function[_lanes_kernel[dtype, qtype, X_ALIGN]](
            y, x, w, Int32(M), Int32(N), Int32(K), Int32(ldy), grid_dim=grid, block_dim=WARPS * WARP_SIZE,
        )


def qmatmul_gpu[dtype: DType, qtype: StaticString, variant: StaticString](
    y: Ptr[dtype], x: Ptr[dtype], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext, ldy: Int
) raises:
    """Launches one warp per (weight row, group of 8 x rows); variant "auto" | "lanes" | "staged"."""
    comptime assert variant == "auto" or variant == "lanes" or variant == "staged", (
        "crucible.qmatmul on GPU: variant is auto, lanes or staged"
    )
    comptime staged = variant == "staged"
    # decode_block reads the header as halves (Q4_1: one 4-byte pair) at the block start; every block
    # start is even (block sizes 18 to 210 are even), and 4-aligned for Q4_1, when the buffer start is.
    # staged loads 16-byte vectors from 16-byte boundaries of the buffer.
    var need = 16 if staged else 4
    if Int(w) % need != 0:
        raise Error("crucible.qmatmul[", variant, "] on GPU: the weight buffer must start ", need, "-byte aligned")
    if Int(x) % 16 == 0:
        _launch[dtype, qtype, staged, 16](y, x, w, M, N, K, ctx, ldy)
    else:
        _launch[dtype, qtype, staged, size_of[dtype]()](y, x, w, M, N, K, ctx, ldy)
