# Batch-1 float-activation decode rows of crucible.qmatmul for the K-quants (M = 1, act = "f32"):
# y[n] = x . dequant(W[n, :]) one 256-value super-block at a time (quant_k.mojo has the layouts).
#
# Why a row of its own: the generic row (qgemv_rows.mojo, decode_chunk) decodes chunk s of a super-block
# with s known only at run time, rereads the super-block's halves for every chunk and scales every
# value before the dot; it ran at about a quarter of the DRAM read rate (compute-bound). Here the 8
# chunks of a super-block are unrolled (s is a compile-time constant, so every shift, byte offset and
# 6-bit scale unpack folds), d and dmin are read once per super-block, and a scale multiplies the
# chunk's (or half-chunk's) combined products once, as the Q4 rows do. Mins (Q2_K, Q4_K, Q5_K) enter
# through sums of x: per 32-value chunk from the caller's xsum (Q4_K, Q5_K), per half in vectors
# (Q2_K, whose mins are per 16 values). Q3_K and Q6_K subtract their quant offset (4, 32) in integers.
# IQ4_XS, a 256-value super-block as well, takes the same row: its levels by table lookup
# (quant_iq.iq4_levels), d * (scale - 32) once per chunk.

from .common import BytePtr, F32, Ptr, load_f16_as_f32
from .qgemv_rows import prefetch_ahead
from .quant import block_bytes, nibble_values
from .quant_iq import IQ4_XS_QS, iq4_nibbles, iq4_xs_scales
from .quant_k import K16, KSUBS, QK_K, U8x16, q3_scale

comptime CHAINS = 4   # independent accumulators (chunk s feeds chain s % CHAINS)


@always_inline
def _u8(p: BytePtr, i: Int) -> U8x16:
    return p.unsafe_offset(i).unsafe_load[width=K16](0)


@always_inline
def _bits[shift: Int, mask: Int](q: U8x16) -> U8x16:
    comptime if shift == 0:
        return q & U8x16(mask)
    else:
        return (q >> U8x16(shift)) & U8x16(mask)


@always_inline
def scales_mins_k4(scales: BytePtr) -> Tuple[SIMD[F32, KSUBS], SIMD[F32, KSUBS]]:
    """All 8 scales and mins of a q4_k / q5_k super-block at once (quant_k.scale_min_k4 lane by lane):
    a = bytes 0..7, b = bytes 4..11 of the 12 packed bytes."""
    comptime U8x8 = SIMD[DType.uint8, KSUBS]
    var a = scales.unsafe_load[width=KSUBS](0)
    var b = scales.unsafe_offset(4).unsafe_load[width=KSUBS](0)
    var first = SIMD[DType.bool, KSUBS](True, True, True, True, False, False, False, False)
    var a_low = a.shuffle[0, 1, 2, 3, 0, 1, 2, 3]()
    var sc = first.select(a & U8x8(63), (b & U8x8(0xF)) | ((a_low >> U8x8(6)) << U8x8(4)))
    var m = first.select(b & U8x8(63), (b >> U8x8(4)) | ((a >> U8x8(6)) << U8x8(4)))
    return (sc.cast[F32](), m.cast[F32]())


@always_inline
def _signed(q: U8x16, offset: Int) -> SIMD[F32, K16]:
    """q - offset as floats, the subtraction in int8 (q < 128)."""
    return (q.cast[DType.int8]() - Int8(offset)).cast[F32]()


def qgemv_row_k[qtype: StaticString](
    x: Ptr[F32], xsum: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n: Int, K: Int, far: Bool
):
    # y[n] = x[0, :] . dequant(W[n, :]); xsum[b] = sum of x[32 b : 32 b + 32].
    comptime SB = block_bytes[qtype]()
    var acc = Array[SIMD[F32, K16], CHAINS](fill=SIMD[F32, K16](0))
    var mins = SIMD[F32, K16](0)   # Q2_K's min terms, per lane
    var mins8 = SIMD[F32, KSUBS](0)  # Q4_K / Q5_K's min terms, per chunk of the super-block
    var row = w.unsafe_offset(n * row_bytes)
    for i in range(K // QK_K):
        var sb = row.unsafe_offset(i * SB)
        comptime for line in range(0, SB, 64):
            prefetch_ahead(sb.unsafe_offset(line), far)
        var xb = x.unsafe_offset(i * QK_K)
        comptime if qtype == "q4_k" or qtype == "q5_k":
            var d = load_f16_as_f32(sb)
            var dmin = load_f16_as_f32(sb.unsafe_offset(2))
            comptime qs_at = 16 if qtype == "q4_k" else 48
            var sm = scales_mins_k4(sb.unsafe_offset(4))
            var scale = sm[0] * d
            # The 8 chunks' min terms in one vector step: -dmin * m[s] * (sum of x over chunk s).
            mins8 = (sm[1] * -dmin).fma(xsum.unsafe_offset(i * KSUBS).unsafe_load[width=KSUBS](0), mins8)
            comptime for s in range(KSUBS):
                comptime shift = 4 * (s % 2)
                var lo_f: SIMD[F32, K16]
                var hi_f: SIMD[F32, K16]
                comptime if qtype == "q4_k":
                    # Nibbles as floats by table lookup (quant.nibble_values: one vpermps on AVX-512).
                    var q_lo = _u8(sb, qs_at + 32 * (s // 2)).cast[DType.int32]()
                    var q_hi = _u8(sb, qs_at + 32 * (s // 2) + K16).cast[DType.int32]()
                    lo_f = nibble_values[0](q_lo >> SIMD[DType.int32, K16](shift))
                    hi_f = nibble_values[0](q_hi >> SIMD[DType.int32, K16](shift))
                else:
                    var lo = _bits[shift, 0xF](_u8(sb, qs_at + 32 * (s // 2))) | (_bits[s, 1](_u8(sb, 16)) << 4)
                    var hi = _bits[shift, 0xF](_u8(sb, qs_at + 32 * (s // 2) + K16)) | (_bits[s, 1](_u8(sb, 16 + K16)) << 4)
                    lo_f = lo.cast[F32]()
                    hi_f = hi.cast[F32]()
                var t = hi_f.fma(xb.unsafe_load[width=K16](32 * s + K16), lo_f * xb.unsafe_load[width=K16](32 * s))
                acc[s % CHAINS] = t.fma(SIMD[F32, K16](scale[s]), acc[s % CHAINS])
        elif qtype == "q6_k":
            var d = load_f16_as_f32(sb.unsafe_offset(208))
            var sc = sb.unsafe_offset(192).unsafe_bitcast[Int8]()
            comptime for s in range(KSUBS):
                comptime h = s // 4
                comptime t4 = s % 4
                comptime ql = 64 * h + 32 * (t4 % 2)
                comptime qh = 128 + 32 * h
                var lo = _bits[4 * (t4 // 2), 0xF](_u8(sb, ql)) | (_bits[2 * t4, 3](_u8(sb, qh)) << 4)
                var hi = _bits[4 * (t4 // 2), 0xF](_u8(sb, ql + K16)) | (_bits[2 * t4, 3](_u8(sb, qh + K16)) << 4)
                var p_lo = _signed(lo, 32) * xb.unsafe_load[width=K16](32 * s)
                var p_hi = _signed(hi, 32) * xb.unsafe_load[width=K16](32 * s + K16)
                var a = p_lo.fma(SIMD[F32, K16](d * Float32(sc[unsafe_offset=8 * h + 2 * t4])), acc[s % CHAINS])
                acc[s % CHAINS] = p_hi.fma(SIMD[F32, K16](d * Float32(sc[unsafe_offset=8 * h + 2 * t4 + 1])), a)
        elif qtype == "q3_k":
            var d = load_f16_as_f32(sb.unsafe_offset(108))
            var scp = sb.unsafe_offset(96)
            comptime for s in range(KSUBS):
                comptime qs = 32 + 32 * (s // 4)
                comptime shift = 2 * (s % 4)
                var lo = _bits[shift, 3](_u8(sb, qs)) | (_bits[s, 1](_u8(sb, 0)) << 2)
                var hi = _bits[shift, 3](_u8(sb, qs + K16)) | (_bits[s, 1](_u8(sb, K16)) << 2)
                var p_lo = _signed(lo, 4) * xb.unsafe_load[width=K16](32 * s)
                var p_hi = _signed(hi, 4) * xb.unsafe_load[width=K16](32 * s + K16)
                var a = p_lo.fma(SIMD[F32, K16](d * q3_scale(scp, 2 * s)), acc[s % CHAINS])
                acc[s % CHAINS] = p_hi.fma(SIMD[F32, K16](d * q3_scale(scp, 2 * s + 1)), a)
        elif qtype == "q2_k":
            var d = load_f16_as_f32(sb.unsafe_offset(80))
            var dmin = load_f16_as_f32(sb.unsafe_offset(82))
            comptime for s in range(KSUBS):
                comptime qs = 16 + 32 * (s // 4)
                comptime shift = 2 * (s % 4)
                var x0 = xb.unsafe_load[width=K16](32 * s)
                var x1 = xb.unsafe_load[width=K16](32 * s + K16)
                var sc_lo = Int(sb[unsafe_offset=2 * s])
                var sc_hi = Int(sb[unsafe_offset=2 * s + 1])
                var p_lo = _bits[shift, 3](_u8(sb, qs)).cast[F32]() * x0
                var p_hi = _bits[shift, 3](_u8(sb, qs + K16)).cast[F32]() * x1
                var a = p_lo.fma(SIMD[F32, K16](d * Float32(sc_lo & 0xF)), acc[s % CHAINS])
                acc[s % CHAINS] = p_hi.fma(SIMD[F32, K16](d * Float32(sc_hi & 0xF)), a)
                mins = x0.fma(SIMD[F32, K16](-dmin * Float32(sc_lo >> 4)), mins)
                mins = x1.fma(SIMD[F32, K16](-dmin * Float32(sc_hi >> 4)), mins)
        elif qtype == "iq4_xs":
            var scale = iq4_xs_scales(sb)
            comptime for s in range(KSUBS):
                var v = iq4_nibbles(sb.unsafe_offset(IQ4_XS_QS + 16 * s))
                var t = v[1].fma(xb.unsafe_load[width=K16](32 * s + K16), v[0] * xb.unsafe_load[width=K16](32 * s))
                acc[s % CHAINS] = t.fma(SIMD[F32, K16](scale[s]), acc[s % CHAINS])
        else:
            comptime assert False, "not a super-block format"
    var total = mins
    comptime for c in range(CHAINS):
        total += acc[c]
    y[unsafe_offset=n] = mins8.reduce_add() + total.reduce_add()
