# Int8-activation decode path of crucible.qmatmul (parameter act="q8"), the scheme llama.cpp runs on
# CPU: each x row is quantized per 32-value block to int8 with one float scale (Q8_0 style, round to
# nearest even), and every block dot product is an integer dot product of weight bytes and x bytes.
#
#   x block b of row m:  dx = max|x| / 127,  qx = round(x / dx),  sx = dx * sum(qx)
#   Q4_1 (q in 0..15):   sum_j w_j x_j  ~  d dx sum_j q_j qx_j + m sx
#   Q4_0 (q - 8):        d dx sum_j q_j qx_j - 8 d sx
#   Q8_0 (int8 q):       the bytes are read as q + 128 (xor 0x80) so they are unsigned like the
#                        nibbles: d dx sum_j (q_j + 128) qx_j - 128 d sx
# The integer sums are exact; the only approximation is qx (relative error <= 0.5/127 of the block's
# max |x|), which the conformance grid bounds separately from the float path.
#
# Why: the float decode kernel converts every weight to float (32 conversions, 2 multiplies per block
# and row); here a block is one u8 x s8 dot-product instruction (AVX512-VNNI vpdpbusd, 4 products
# per int32 lane) plus one float FMA. Targets without VNNI use a portable integer emulation with the
# same results.

from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget

from .common import BytePtr, F32, Ptr

comptime I8Ptr = Pointer[Int8, MutAnyOrigin]


@always_inline
def dot_u8_i8(acc: SIMD[DType.int32, 8], w: SIMD[DType.uint8, 32], x: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    """acc[i] + sum_{j < 4} w[4i + j] * x[4i + j] (u8 x s8 products, exact in int32)."""
    comptime if CompilationTarget.has_vnni():
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.256", SIMD[DType.int32, 8]](acc, w, x)
    else:
        var p = w.cast[DType.int32]() * x.cast[DType.int32]()
        var out = acc
        comptime for i in range(8):
            out[i] += p[4 * i] + p[4 * i + 1] + p[4 * i + 2] + p[4 * i + 3]
        return out


def quantize_rows_q8(x: Ptr[F32], rows: Int, K: Int, qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32]):
    """x [rows, K] float32 -> qx [rows, K] int8, dx [rows, K/32] scales, sx [rows, K/32] = dx * sum(qx)."""
    var nb = K // 32
    for m in range(rows):
        for b in range(nb):
            var v = x.unsafe_load[width=32](m * K + b * 32)
            var amax = abs(v).reduce_max()
            var d = amax / 127.0
            var inv = Float32(127.0) / amax if amax > 0 else Float32(0)
            var q = (v * inv).__round__().cast[DType.int8]()
            qx.unsafe_store(m * K + b * 32, q)
            dx[unsafe_offset=m * nb + b] = d
            sx[unsafe_offset=m * nb + b] = d * Float32(q.cast[DType.int32]().reduce_add())
