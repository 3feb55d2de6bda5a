# GPU matmul: y[M, N] = x[M, K] @ W[N, K]^T with fp32 accumulation; x, W and y share one dtype.
#
# Variants (the op's `variant` parameter; "auto" picks gemv for M <= 8, else tensor_core for bf16/fp16
# on NVIDIA and tiled otherwise):
#   tiled        64x64 block tile, 16x16 threads each owning a 4x4 register tile, K staged through
#                shared memory 16 at a time. Any float dtype (fp32 included); the portable baseline.
#   tensor_core  mma.sync m16n8k8 (bf16 or fp16 in, fp32 accumulate). 4 warps per 64x64 block tile,
#                each warp a 32x32 sub-tile of 2x4 mma tiles; K staged through shared memory 32 at a
#                time; fragments gathered in the PTX register layout. NVIDIA only (sm_80+): on HIP
#                "auto" runs tiled and an explicit tensor_core request is an error.
#   tensor_core_vec  tensor_core whose tiles are filled with 16-byte vector loads (8 elements, K % 8 == 0
#                and aligned bases, else element by element), the next K step's loaded into registers
#                while this step's mma run. tensor_core issues 16 two-byte loads per thread per step and
#                waits for them. Opt-in until timed on a GPU (compiled, not yet run).
#   gemv         one warp per weight row and per group of up to 8 rows of x: lanes read the row in
#                16-byte vectors, coalesced, and the warp reduces. For decode each weight is read once
#                and every SM has rows to stream; a 64x64 tile would leave 63 of its 64 rows idle.
# All handle any M, N, K: the tiles zero-fill out-of-range elements, gemv falls back to scalar loads
# when K or a base address does not allow 16-byte vectors.

from std.memory import stack_allocation
from max.gpu import WARP_SIZE, barrier, block_idx, lane_id, thread_idx
from max.gpu.compute.mma import mma
from max.gpu.host import DeviceContext
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import sum as warp_sum
from std.sys import is_nvidia_gpu, size_of

from .common import F32, Ptr, ceil_div

comptime TILE = 64        # block tile (both variants), rows and columns
comptime TK_TILED = 16
comptime TK_TC = 32
comptime SMEM_PAD = 8     # keeps rows of the shared tiles on different banks
comptime GEMV_WARPS = 8   # weight rows (warps) per block
comptime GEMV_MGROUP = 8  # rows of x per warp
comptime GEMV_UNROLL = 4  # weight vectors each lane loads before using them


def _matmul_tiled_kernel[dtype: DType](
    y: Ptr[dtype], x: Ptr[dtype], w: Ptr[dtype], M: Int32, N: Int32, K: Int32
):
    # 256 threads (16 x 16); thread (ty, tx) owns rows ty + 16*i and columns tx + 16*j, i, j < 4.
    var xs = stack_allocation[TILE * TK_TILED, Float32, address_space=AddressSpace.SHARED]()
    var ws = stack_allocation[TILE * TK_TILED, Float32, address_space=AddressSpace.SHARED]()
    var tid = Int(thread_idx.x)
    var tx = tid % 16
    var ty = tid // 16
    var m0 = Int(block_idx.y) * TILE
    var n0 = Int(block_idx.x) * TILE
    var m_ = Int(M)
    var n_ = Int(N)
    var k_ = Int(K)
    var acc = Array[Float32, 16](fill=0)
    var k0 = 0
    while k0 < k_:
        # 64 x 16 elements of each operand, 4 per thread; the tile is stored k-major: s[k * 64 + row].
        for e in range(4):
            var idx = tid + e * 256
            var r = idx // TK_TILED
            var kk = idx % TK_TILED
            var xv = Float32(0)
            var wv = Float32(0)
            if m0 + r < m_ and k0 + kk < k_:
                xv = x[unsafe_offset=(m0 + r) * k_ + k0 + kk].cast[F32]()
            if n0 + r < n_ and k0 + kk < k_:
                wv = w[unsafe_offset=(n0 + r) * k_ + k0 + kk].cast[F32]()
            xs[unsafe_offset=kk * TILE + r] = xv
            ws[unsafe_offset=kk * TILE + r] = wv
        barrier()
        for kk in range(TK_TILED):
            comptime for i in range(4):
                var a = xs[unsafe_offset=kk * TILE + ty + 16 * i]
                comptime for j in range(4):
                    acc[i * 4 + j] += a * ws[unsafe_offset=kk * TILE + tx + 16 * j]
        barrier()
        k0 += TK_TILED
    comptime for i in range(4):
        comptime for j in range(4):
            var r = m0 + ty + 16 * i
            var c = n0 + tx + 16 * j
            if r < m_ and c < n_:
                y[unsafe_offset=r * n_ + c] = acc[i * 4 + j].cast[dtype]()


def _matmul_tc_kernel[dtype: DType, VFILL: Bool](
    y: Ptr[dtype], x: Ptr[dtype], w: Ptr[dtype], M: Int32, N: Int32, K: Int32
):
    comptime if is_nvidia_gpu():
        _matmul_tc_body[dtype, VFILL](y, x, w, M, N, K)


@always_inline
def _tc_fill[dtype: DType](
    src: Ptr[dtype], row0: Int, rows: Int, k0: Int, k_: Int, tid: Int
) -> Array[SIMD[dtype, 8], 2]:
    """tensor_core_vec: this thread's two 8-element vectors of a 64 x 32 tile (4 vectors per row),
    zero past the matrix; K % 8 == 0 and 16-byte aligned bases (checked at launch)."""
    var out = Array[SIMD[dtype, 8], 2](fill=SIMD[dtype, 8](0))
    comptime for e in range(2):
        var idx = tid + e * 128
        var r = idx // 4
        var kk = (idx % 4) * 8
        if row0 + r < rows and k0 + kk < k_:
            out[e] = src.unsafe_load[width=8, alignment=16]((row0 + r) * k_ + k0 + kk)
    return out^


@always_inline
def _matmul_tc_body[dtype: DType, VFILL: Bool](
    y: Ptr[dtype], x: Ptr[dtype], w: Ptr[dtype], M: Int32, N: Int32, K: Int32
):
    # 128 threads = 4 warps; warp wid owns rows (wid // 2) * 32 + [0, 32), columns (wid % 2) * 32 + [0, 32).
    comptime LD = TK_TC + SMEM_PAD
    var xs = stack_allocation[TILE * LD, Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16]()
    var ws = stack_allocation[TILE * LD, Scalar[dtype], address_space=AddressSpace.SHARED, alignment=16]()
    var tid = Int(thread_idx.x)
    var lane = Int(lane_id())
    var wid = tid // 32
    var g = lane // 4        # PTX "groupID"
    var t = lane % 4         # PTX "threadID_in_group"
    var wm = (wid // 2) * 32
    var wn = (wid % 2) * 32
    var m0 = Int(block_idx.y) * TILE
    var n0 = Int(block_idx.x) * TILE
    var m_ = Int(M)
    var n_ = Int(N)
    var k_ = Int(K)
    var acc = Array[SIMD[F32, 4], 8](fill=SIMD[F32, 4](0))
    # tensor_core_vec: the next K step's vectors are loaded into registers while this step's mma run.
    var xr = Array[SIMD[dtype, 8], 2](fill=SIMD[dtype, 8](0))
    var wr = Array[SIMD[dtype, 8], 2](fill=SIMD[dtype, 8](0))
    comptime if VFILL:
        xr = _tc_fill(x, m0, m_, 0, k_, tid)
        wr = _tc_fill(w, n0, n_, 0, k_, tid)
    var k0 = 0
    while k0 < k_:
        comptime if VFILL:
            comptime for e in range(2):
                var idx = tid + e * 128
                var off = (idx // 4) * LD + (idx % 4) * 8
                xs.unsafe_offset(off).unsafe_store[alignment=16](0, xr[e])
                ws.unsafe_offset(off).unsafe_store[alignment=16](0, wr[e])
            barrier()
            if k0 + TK_TC < k_:
                xr = _tc_fill(x, m0, m_, k0 + TK_TC, k_, tid)
                wr = _tc_fill(w, n0, n_, k0 + TK_TC, k_, tid)
        else:
            # 64 x 32 elements per operand, 16 per thread, row-major s[row * LD + k].
            for e in range(16):
                var idx = tid + e * 128
                var r = idx // TK_TC
                var kk = idx % TK_TC
                var xv = Scalar[dtype](0)
                var wv = Scalar[dtype](0)
                if m0 + r < m_ and k0 + kk < k_:
                    xv = x[unsafe_offset=(m0 + r) * k_ + k0 + kk]
                if n0 + r < n_ and k0 + kk < k_:
                    wv = w[unsafe_offset=(n0 + r) * k_ + k0 + kk]
                xs[unsafe_offset=r * LD + kk] = xv
                ws[unsafe_offset=r * LD + kk] = wv
            barrier()
        comptime for ks in range(TK_TC // 8):
            var kb = ks * 8 + t * 2
            var a = Array[SIMD[dtype, 4], 2](fill=SIMD[dtype, 4](0))
            comptime for mi in range(2):
                var r = wm + mi * 16 + g
                a[mi] = SIMD[dtype, 4](
                    xs[unsafe_offset=r * LD + kb], xs[unsafe_offset=r * LD + kb + 1],
                    xs[unsafe_offset=(r + 8) * LD + kb], xs[unsafe_offset=(r + 8) * LD + kb + 1],
                )
            comptime for ni in range(4):
                var n = wn + ni * 8 + g
                var b = SIMD[dtype, 2](ws[unsafe_offset=n * LD + kb], ws[unsafe_offset=n * LD + kb + 1])
                comptime for mi in range(2):
                    var d = acc[mi * 4 + ni]
                    mma(d, a[mi], b, acc[mi * 4 + ni])
                    acc[mi * 4 + ni] = d
        barrier()
        k0 += TK_TC
    comptime for mi in range(2):
        comptime for ni in range(4):
            var r = m0 + wm + mi * 16 + g
            var c = n0 + wn + ni * 8 + t * 2
            var v = acc[mi * 4 + ni]
            comptime for h in range(2):
                var rr = r + 8 * h
                if rr < m_:
                    if c < n_:
                        y[unsafe_offset=rr * n_ + c] = v[2 * h].cast[dtype]()
                    if c + 1 < n_:
                        y[unsafe_offset=rr * n_ + c + 1] = v[2 * h + 1].cast[dtype]()


def _matmul_gemv_kernel[dtype: DType, VEC: Int](
    y: Ptr[dtype], x: Ptr[dtype], w: Ptr[dtype], M: Int32, N: Int32, K: Int32
):
    # Warp wi of block (bx, by) owns weight row n = bx * GEMV_WARPS + wi and rows m0 .. m0 + 7 of x.
    # Lane l reads VEC consecutive elements at k = (l + WARP_SIZE * i) * VEC, so a warp reads
    # WARP_SIZE * VEC contiguous elements per step; x rows are small and stay in L1/L2.
    var lane = Int(lane_id())
    var n = Int(block_idx.x) * GEMV_WARPS + Int(thread_idx.x) // WARP_SIZE
    var m0 = Int(block_idx.y) * GEMV_MGROUP
    var m_ = Int(M)
    var n_ = Int(N)
    var k_ = Int(K)
    if n >= n_:
        return
    var rows = min(GEMV_MGROUP, m_ - m0)
    var acc = Array[SIMD[F32, VEC], GEMV_MGROUP](fill=SIMD[F32, VEC](0))
    # The alignment tells the compiler a vector is one 16-byte load (the launcher checked it), not
    # VEC two-byte ones. GEMV_UNROLL weight loads are issued before their FMAs: more bytes in flight.
    comptime ALIGN = VEC * size_of[dtype]()
    comptime STEP = WARP_SIZE * VEC
    var k = lane * VEC
    while k < k_:
        var wv = Array[SIMD[F32, VEC], GEMV_UNROLL](fill=SIMD[F32, VEC](0))
        comptime for u in range(GEMV_UNROLL):
            if k + u * STEP < k_:
                wv[u] = w.unsafe_load[width=VEC, alignment=ALIGN](n * k_ + k + u * STEP).cast[F32]()
        comptime for u in range(GEMV_UNROLL):
            if k + u * STEP < k_:
                comptime for m in range(GEMV_MGROUP):
                    if m < rows:
                        var xv = x.unsafe_load[width=VEC, alignment=ALIGN]((m0 + m) * k_ + k + u * STEP)
                        acc[m] = xv.cast[F32]().fma(wv[u], acc[m])
        k += GEMV_UNROLL * STEP
    comptime for m in range(GEMV_MGROUP):
        var total = warp_sum(acc[m].reduce_add())
        if lane == 0 and m < rows:
            y[unsafe_offset=(m0 + m) * n_ + n] = total.cast[dtype]()


def matmul_gpu[dtype: DType, variant: StaticString](
    y: Ptr[dtype], x: Ptr[dtype], w: Ptr[dtype], M: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    """Launches the GPU variant; "auto" is gemv for M <= 8, else tensor_core for bf16/fp16, else tiled."""
    comptime vec = variant == "tensor_core_vec"
    comptime use_tc = variant == "tensor_core" or vec or (
        variant == "auto" and (dtype == DType.bfloat16 or dtype == DType.float16)
    )
    comptime assert (
        variant == "auto" or variant == "tiled" or variant == "tensor_core" or vec or variant == "gemv"
    ), "crucible.matmul on GPU: variant must be auto, tiled, tensor_core, tensor_core_vec or gemv"
    if variant == "gemv" or (variant == "auto" and M <= GEMV_MGROUP):
        # 16-byte vectors need K and both base addresses to keep every row start 16-byte aligned.
        comptime VEC = 16 // size_of[dtype]()
        var gemv_grid = (ceil_div(N, GEMV_WARPS), ceil_div(M, GEMV_MGROUP))
        if K % VEC == 0 and Int(x) % 16 == 0 and Int(w) % 16 == 0:
            ctx.enqueue_function[_matmul_gemv_kernel[dtype, VEC]](
                y, x, w, Int32(M), Int32(N), Int32(K), grid_dim=gemv_grid, block_dim=GEMV_WARPS * WARP_SIZE
            )
        else:
            ctx.enqueue_function[_matmul_gemv_kernel[dtype, 1]](
                y, x, w, Int32(M), Int32(N), Int32(K), grid_dim=gemv_grid, block_dim=GEMV_WARPS * WARP_SIZE
            )
        return
    var grid = (ceil_div(N, TILE), ceil_div(M, TILE))
    var nvidia = ctx.api() == "cuda"
    comptime if use_tc:
        comptime assert dtype == DType.bfloat16 or dtype == DType.float16, (
            "tensor_core matmul takes bf16 or fp16"
        )
        if nvidia:
            # tensor_core_vec's 16-byte loads need K % 8 == 0 and 16-byte aligned bases; otherwise it
            # fills element by element as tensor_core does (same kernel, same result).
            # (comptime: "auto" and tensor_core graphs never compile the vector-fill kernel.)
            comptime if vec:
                if K % 8 == 0 and Int(x) % 16 == 0 and Int(w) % 16 == 0:
                    ctx.enqueue_function[_matmul_tc_kernel[dtype, True]](
                        y, x, w, Int32(M), Int32(N), Int32(K), grid_dim=grid, block_dim=128
                    )
                    return
            ctx.enqueue_function[_matmul_tc_kernel[dtype, False]](
                y, x, w, Int32(M), Int32(N), Int32(K), grid_dim=grid, block_dim=128
            )
            return
        comptime if variant == "tensor_core" or vec:
            raise Error("crucible.matmul: the tensor_core variant needs an NVIDIA GPU (mma.sync); use tiled")
    ctx.enqueue_function[_matmul_tiled_kernel[dtype]](
        y, x, w, Int32(M), Int32(N), Int32(K), grid_dim=grid, block_dim=256
    )
