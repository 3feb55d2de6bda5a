# Int8-activation decode rows of crucible.qmatmul for the K-quants (act = "q8", M <= 32):
# y[m, n] = x[m, :] . dequant(W[n, :]) one 256-value super-block at a time, x quantized to int8 per
# 32-value block (qdot_int8.quantize_rows_q8), so chunk s of a super-block meets exactly one x block.
#
# Why: the float K-quant rows (qgemv_ksuper.mojo) are compute-bound, they ran no faster in cache than
# from DRAM. Here a super-block's 256 weight bytes become four 64-byte dot products (vpdpbusd with
# AVX-512 VNNI), each covering two chunks, and the float work per super-block is a few vectors. This
# is llama.cpp's Q4_K x Q8_K idea with x kept in 32-value blocks (our act = "q8" form, one bound for
# every format), so the scale of a chunk is d * sc * dx and is applied to the chunk's int32 lanes.
#
# Which chunks share a 64-byte dot product, as the bytes lie (quant_k.mojo has the layouts); x is laid
# out once per call with its chunks in that order (kq8_position) where it is not the natural one:
#   q4_k, q5_k  qs[64 u .. 64 u + 63]: low nibbles are chunks (4u, 4u + 2), high nibbles (4u + 1, 4u + 3).
#               Q5_K's fifth bit of chunk s is bit s of qh[l]. Mins enter as -dmin * m * sx per chunk.
#   q6_k        ql[64 h ..] low nibbles | qh bits 0-1 / 2-3 are chunks (4h, 4h + 1), high nibbles |
#               qh bits 4-5 / 6-7 are (4h + 2, 4h + 3); x in its natural order.
#   q2_k, q3_k  bits 2u..2u+1 of qs[0..63] are chunks (u, u + 4); Q3_K's third bit of chunk s is bit s
#               of hmask[l].
# Q2_K, Q3_K and Q6_K scale per 16 values (4 int32 lanes). Their offsets (Q2_K's mins, Q3_K's -4,
# Q6_K's -32) enter as one 16-lane FMA per super-block over xh = dx * (sum of each 16 qx).

from std.memory import bitcast

from .common import BytePtr, F32, Ptr, load_f16_as_f32
from .qdot_int8 import I8Ptr, dot_u8_i8_x2
from .qgemv_ksuper import scales_mins_k4
from .qgemv_rows import prefetch_ahead
from .quant_k import KSUBS, QK_K, kblock_bytes

comptime U8x64 = SIMD[DType.uint8, 64]
comptime I32x16 = SIMD[DType.int32, 16]
comptime F32x16 = SIMD[F32, 16]
comptime U8x16x2 = SIMD[DType.uint8, 32]

def kq8_position[qtype: StaticString](c: Int) -> Int:
    """Where chunk c (0..7) of a super-block sits in the laid-out x (kq8_layout)."""
    comptime if qtype == "q4_k" or qtype == "q5_k":
        return 4 * (c // 4) + 2 * (c % 2) + (c % 4) // 2  # 0, 2, 1, 3, 4, 6, 5, 7
    elif qtype == "q2_k" or qtype == "q3_k":
        return 2 * (c % 4) + c // 4  # 0, 2, 4, 6, 1, 3, 5, 7
    return c


def kq8_permutes_x[qtype: StaticString]() -> Bool:
    """Whether the rows read x with its chunks reordered (kq8_layout) rather than as quantized."""
    return qtype != "q6_k"


def kq8_uses_xh[qtype: StaticString]() -> Bool:
    """Whether the rows take an offset per 16 values (xh)."""
    return qtype == "q2_k" or qtype == "q3_k" or qtype == "q6_k"


def kq8_layout[qtype: StaticString](qx: I8Ptr, dx: Ptr[F32], rows: Int, K: Int, qxk: I8Ptr, xh: Ptr[F32]):
    """Per-call x data of the rows below, from quantize_rows_q8's qx [rows, K] and dx [rows, K / 32]:
    qxk [rows, K] with each super-block's chunks at kq8_position (where kq8_permutes_x), and xh
    [rows, K / 16], dx times the sum of each 16 qx bytes (where kq8_uses_xh)."""
    for m in range(rows):
        for c in range(K // 32):
            var src = qx.unsafe_offset(m * K + 32 * c).unsafe_load[width=32](0)
            comptime if kq8_permutes_x[qtype]():
                var p = QK_K * (c // KSUBS) + 32 * kq8_position[qtype](c % KSUBS)
                qxk.unsafe_offset(m * K + p).unsafe_store(0, src)
            comptime if kq8_uses_xh[qtype]():
                var s = src.cast[DType.int32]()
                var d = dx[unsafe_offset=m * (K // 32) + c]
                xh[unsafe_offset=m * (K // 16) + 2 * c] = d * Float32(s.slice[16, offset=0]().reduce_add())
                xh[unsafe_offset=m * (K // 16) + 2 * c + 1] = d * Float32(s.slice[16, offset=16]().reduce_add())


@always_inline
def _lanes8[a: Int, b: Int](v: SIMD[F32, 8]) -> F32x16:
    """[v[a] x8, v[b] x8]: the scales of a dot product's two chunks over its 16 int32 lanes."""
    return SIMD[F32, 8](v[a]).join(SIMD[F32, 8](v[b]))


@always_inline
def _lanes4[a: Int, b: Int, c: Int, e: Int](v: F32x16) -> F32x16:
    """[v[a] x4, v[b] x4, v[c] x4, v[e] x4]: per-16-value scales over a dot product's 16 int32 lanes."""
    return SIMD[F32, 4](v[a]).join(SIMD[F32, 4](v[b])).join(SIMD[F32, 4](v[c]).join(SIMD[F32, 4](v[e])))


@always_inline
def _per16(sc: F32x16, dx8: SIMD[F32, 8]) -> F32x16:
    """sc times each 16 values' x scale: lane j takes dx8[j // 2] (16-value half j of chunk j // 2)."""
    return sc * dx8.join(dx8).shuffle[0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]()


@always_inline
def _q3_scales(sp: BytePtr) -> SIMD[F32, 16]:
    """Q3_K's 16 scales minus 32 (quant_k.q3_scale lane by lane): low 4 bits nibble i / 8 of byte i % 8,
    high 2 bits at bit 2 (i / 4) of byte 8 + i % 4."""
    comptime U8x16 = SIMD[DType.uint8, 16]
    var a = sp.unsafe_load[width=8](0)
    var a16 = a.join(a)
    var first = SIMD[DType.bool, 16](True, True, True, True, True, True, True, True,
                                     False, False, False, False, False, False, False, False)
    var low = first.select(a16 & U8x16(0xF), a16 >> U8x16(4))
    var b = sp.unsafe_offset(8).unsafe_load[width=4](0)
    var b16 = b.join(b).join(b.join(b))
    var high = (b16 >> U8x16(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6)) & U8x16(3)
    return (low | (high << 4)).cast[DType.int32]().cast[F32]() - 32


@always_inline
def _wdot[qtype: StaticString](w: U8x64, x: I8Ptr) -> I32x16:
    comptime w_max = 63 if qtype == "q6_k" else (31 if qtype == "q5_k" else (15 if qtype == "q4_k" else 7))
    return dot_u8_i8_x2[w_max](I32x16(0), w, x.unsafe_load[width=64](0))


def qgemv_row_k_q8[MROWS: Int, qtype: StaticString](
    qxk: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], xh: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32],
    n: Int, N: Int, K: Int, far: Bool,
):
    # y[m, n] for m < MROWS. qxk: x bytes [MROWS, K] (kq8_layout's order where kq8_permutes_x, else
    # qx); dx, sx: [MROWS, K / 32] (quantize_rows_q8); xh: [MROWS, K / 16] where kq8_uses_xh.
    comptime SB = kblock_bytes[qtype]()
    var nb = K // 32
    var row = w.unsafe_offset(n * row_bytes)
    var acc = Array[F32x16, MROWS](fill=F32x16(0))
    var side = Array[F32x16, MROWS](fill=F32x16(0))  # mins (Q4_K / Q5_K: 8 lanes used) or the xh offsets
    for i in range(K // QK_K):
        var sb = row.unsafe_offset(i * SB)
        comptime for line in range(0, SB, 64):
            prefetch_ahead(sb.unsafe_offset(line), far)
        comptime if qtype == "q4_k" or qtype == "q5_k":
            var d = load_f16_as_f32(sb)
            var dmin = load_f16_as_f32(sb.unsafe_offset(2))
            comptime qs_at = 16 if qtype == "q4_k" else 48
            var sm = scales_mins_k4(sb.unsafe_offset(4))
            var dsc = sm[0] * d
            var mn = sm[1] * -dmin
            var wv = Array[U8x64, 4](fill=U8x64(0))  # chunks (0, 2), (1, 3), (4, 6), (5, 7)
            comptime for u in range(2):
                var q = sb.unsafe_offset(qs_at + 64 * u).unsafe_load[width=64](0)
                wv[2 * u] = q & 0xF
                wv[2 * u + 1] = q >> 4
                comptime if qtype == "q5_k":
                    var qh = sb.unsafe_offset(16).unsafe_load[width=32](0)
                    var qh2 = (qh >> SIMD[DType.uint8, 32](4 * u)).join(qh >> SIMD[DType.uint8, 32](4 * u + 2))
                    wv[2 * u] |= (qh2 & 1) << 4
                    wv[2 * u + 1] |= (qh2 & 2) << 3
            comptime for m in range(MROWS):
                var xb = qxk.unsafe_offset(m * K + i * QK_K)
                var s8 = dsc * dx.unsafe_load[width=8](m * nb + i * KSUBS)
                comptime for u in range(2):
                    var lo = _wdot[qtype](wv[2 * u], xb.unsafe_offset(128 * u))
                    var hi = _wdot[qtype](wv[2 * u + 1], xb.unsafe_offset(128 * u + 64))
                    acc[m] = lo.cast[F32]().fma(_lanes8[4 * u, 4 * u + 2](s8), acc[m])
                    acc[m] = hi.cast[F32]().fma(_lanes8[4 * u + 1, 4 * u + 3](s8), acc[m])
                var mins = mn * sx.unsafe_load[width=8](m * nb + i * KSUBS)
                side[m] += mins.join(SIMD[F32, 8](0))
        elif qtype == "q6_k":
            var d = load_f16_as_f32(sb.unsafe_offset(208))
            var sc = bitcast[DType.int8, 16](sb.unsafe_offset(192).unsafe_load[width=16](0)).cast[F32]() * d
            var wv = Array[U8x64, 4](fill=U8x64(0))  # chunks (0, 1), (2, 3), (4, 5), (6, 7)
            comptime for h in range(2):
                var ql = sb.unsafe_offset(64 * h).unsafe_load[width=64](0)
                var qh = sb.unsafe_offset(128 + 32 * h).unsafe_load[width=32](0)
                var qh2 = qh.join(qh >> 2)
                wv[2 * h] = (ql & 0xF) | ((qh2 & 3) << 4)
                wv[2 * h + 1] = (ql >> 4) | (((qh2 >> 4) & 3) << 4)
            comptime for m in range(MROWS):
                var xb = qxk.unsafe_offset(m * K + i * QK_K)
                var dx8 = dx.unsafe_load[width=8](m * nb + i * KSUBS)
                var t = _per16(sc, dx8)
                comptime for j in range(4):
                    var dp = _wdot[qtype](wv[j], xb.unsafe_offset(64 * j))
                    acc[m] = dp.cast[F32]().fma(_lanes4[4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3](t), acc[m])
                side[m] = sc.fma(xh.unsafe_load[width=16](m * (K // 16) + 16 * i), side[m])
        elif qtype == "q2_k" or qtype == "q3_k":
            comptime qs_at = 16 if qtype == "q2_k" else 32
            var sc: F32x16   # d * scale per 16 values
            var off: F32x16  # the offset per 16 values, times xh: Q2_K's dmin * m, Q3_K's 4 d sc
            comptime if qtype == "q2_k":
                var d = load_f16_as_f32(sb.unsafe_offset(80))
                var dmin = load_f16_as_f32(sb.unsafe_offset(82))
                var raw = sb.unsafe_load[width=16](0)
                sc = (raw & 0xF).cast[F32]() * d
                off = (raw >> 4).cast[F32]() * dmin
            else:
                sc = _q3_scales(sb.unsafe_offset(96)) * load_f16_as_f32(sb.unsafe_offset(108))
                off = sc * 4
            var q = sb.unsafe_offset(qs_at).unsafe_load[width=64](0)
            var hm = sb.unsafe_load[width=32](0)  # Q3_K's hmask (unused for Q2_K)
            var wv = Array[U8x64, 4](fill=U8x64(0))  # chunks (0, 4), (1, 5), (2, 6), (3, 7)
            comptime for u in range(4):
                wv[u] = (q >> U8x64(2 * u)) & 3
                comptime if qtype == "q3_k":
                    wv[u] |= (((hm >> U8x16x2(u)).join(hm >> U8x16x2(u + 4))) & 1) << 2
            comptime for m in range(MROWS):
                var xb = qxk.unsafe_offset(m * K + i * QK_K)
                var dx8 = dx.unsafe_load[width=8](m * nb + i * KSUBS)
                var t = _per16(sc, dx8)
                comptime for u in range(4):
                    var dp = _wdot[qtype](wv[u], xb.unsafe_offset(64 * u))
                    acc[m] = dp.cast[F32]().fma(_lanes4[2 * u, 2 * u + 1, 2 * u + 8, 2 * u + 9](t), acc[m])
                side[m] = off.fma(xh.unsafe_load[width=16](m * (K // 16) + 16 * i), side[m])
        else:
            comptime assert False, "not a K-quant"
    comptime for m in range(MROWS):
        comptime if qtype == "q6_k":
            y[unsafe_offset=m * N + n] = acc[m].reduce_add() - 32 * side[m].reduce_add()
        elif qtype == "q2_k" or qtype == "q3_k":
            y[unsafe_offset=m * N + n] = acc[m].reduce_add() - side[m].reduce_add()
        else:
            y[unsafe_offset=m * N + n] = acc[m].reduce_add() + side[m].reduce_add()
