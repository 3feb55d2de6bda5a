# GGUF K-quant super-blocks, read byte for byte as llama.cpp writes them (ggml-common.h, and
# dequantize_row_q*_K in ggml-quants.c). A super-block holds 256 values as 8 sub-blocks of 32; the
# kernels walk rows in 32-value chunks, so decode_ksub decodes chunk s (0..7) of one super-block into
# two 16-lane halves, the shape every other format decodes to (quant.decode_block).
#
#   q2_k   84 bytes: scales[16] (low nibble scale, high nibble min, per 16 values), qs[64] (2-bit),
#          f16 d, f16 dmin;  v = d * sc * q - dmin * m
#   q3_k  110 bytes: hmask[32] (high bit), qs[64] (low 2 bits), scales[12] (16 packed 6-bit), f16 d;
#          v = d * (sc - 32) * (q - (high bit ? 0 : 4))
#   q4_k  144 bytes: f16 d, f16 dmin, scales[12] (8 packed 6-bit scales and mins), qs[128] (4-bit);
#          v = d * sc * q - dmin * m
#   q5_k  176 bytes: as q4_k, with qh[32] (fifth bit) before qs
#   q6_k  210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16] (per 16 values), f16 d;
#          v = d * sc * (q - 32)
#
# Chunk s covers values 32 s .. 32 s + 31 of the super-block. Where its quants sit:
#   q2_k, q3_k: bytes qs[32 (s / 4) + l] at bit 2 (s % 4); q3_k's high bit is hmask[l] bit s
#   q4_k, q5_k: bytes qs[32 (s / 2) + l], low nibble for even s, high for odd; q5_k's fifth bit qh[l] bit s
#   q6_k:       ql[64 (s / 4) + 32 (s % 2) + l] nibble (s % 4) / 2, qh[32 (s / 4) + l] bits 2 (s % 4)
# Scales are per 16 values (q2_k, q3_k, q6_k: halves lo and hi) or per 32 (q4_k, q5_k).

from .common import BytePtr, F32, load_f16_as_f32

comptime QK_K = 256       # values per super-block
comptime KSUBS = 8        # 32-value chunks per super-block
comptime K16 = 16         # lanes per decoded half (quant.HALF)

comptime U8x16 = SIMD[DType.uint8, K16]


def is_kquant[qtype: StaticString]() -> Bool:
    return qtype == "q2_k" or qtype == "q3_k" or qtype == "q4_k" or qtype == "q5_k" or qtype == "q6_k"


def kblock_bytes[qtype: StaticString]() -> Int:
    """Bytes of one 256-value super-block."""
    comptime if qtype == "q2_k":
        return 84
    elif qtype == "q3_k":
        return 110
    elif qtype == "q4_k":
        return 144
    elif qtype == "q5_k":
        return 176
    elif qtype == "q6_k":
        return 210
    else:
        comptime assert False, "not a K-quant"


@always_inline
def _byte(p: BytePtr, i: Int) -> Int:
    return Int(p[unsafe_offset=i])


@always_inline
def _u8(p: BytePtr, i: Int) -> U8x16:
    return p.unsafe_offset(i).unsafe_load[width=K16](0)


@always_inline
def _bits(q: U8x16, shift: Int, mask: Int) -> U8x16:
    return (q >> U8x16(UInt8(shift))) & U8x16(UInt8(mask))


@always_inline
def scale_min_k4(scales: BytePtr, j: Int) -> Tuple[Float32, Float32]:
    """Scale and min j (0..7) of a q4_k / q5_k super-block: 6-bit values packed in 12 bytes
    (ggml's get_scale_min_k4)."""
    if j < 4:
        return (Float32(_byte(scales, j) & 63), Float32(_byte(scales, j + 4) & 63))
    var sc = (_byte(scales, j + 4) & 0xF) | ((_byte(scales, j - 4) >> 6) << 4)
    var m = (_byte(scales, j + 4) >> 4) | ((_byte(scales, j) >> 6) << 4)
    return (Float32(sc), Float32(m))


@always_inline
def q3_scale(scales: BytePtr, i: Int) -> Float32:
    """Scale i (0..15) of a q3_k super-block, minus its offset 32: the low 4 bits are nibble i / 8 of
    byte i % 8, the high 2 bits sit at bit 2 (i / 4) of byte 8 + i % 4."""
    var low = (_byte(scales, i % 8) >> (4 * (i // 8))) & 0xF
    var high = (_byte(scales, 8 + i % 4) >> (2 * (i // 4))) & 3
    return Float32((low | (high << 4)) - 32)


@always_inline
def decode_ksub[qtype: StaticString](sb: BytePtr, s: Int) -> Tuple[SIMD[F32, K16], SIMD[F32, K16]]:
    """Decodes chunk s (values 32 s .. 32 s + 31) of the super-block at `sb` into (lo, hi) halves."""
    comptime if qtype == "q4_k" or qtype == "q5_k":
        var d = load_f16_as_f32(sb)
        var dmin = load_f16_as_f32(sb.unsafe_offset(2))
        var sm = scale_min_k4(sb.unsafe_offset(4), s)
        comptime qs_at = 16 if qtype == "q4_k" else 48
        var shift = 4 * (s % 2)
        var lo = _bits(_u8(sb, qs_at + 32 * (s // 2)), shift, 0xF)
        var hi = _bits(_u8(sb, qs_at + 32 * (s // 2) + K16), shift, 0xF)
        comptime if qtype == "q5_k":
            lo |= _bits(_u8(sb, 16), s, 1) << 4
            hi |= _bits(_u8(sb, 16 + K16), s, 1) << 4
        var scale = SIMD[F32, K16](d * sm[0])
        var offset = SIMD[F32, K16](-dmin * sm[1])
        return (lo.cast[F32]().fma(scale, offset), hi.cast[F32]().fma(scale, offset))
    elif qtype == "q6_k":
        var d = load_f16_as_f32(sb.unsafe_offset(208))
        var h = s // 4
        var t = s % 4
        var ql = 64 * h + 32 * (t % 2)
        var qh = 128 + 32 * h
        var lo = _bits(_u8(sb, ql), 4 * (t // 2), 0xF) | (_bits(_u8(sb, qh), 2 * t, 3) << 4)
        var hi = _bits(_u8(sb, ql + K16), 4 * (t // 2), 0xF) | (_bits(_u8(sb, qh + K16), 2 * t, 3) << 4)
        var sc = sb.unsafe_offset(192 + 8 * h + 2 * t).unsafe_bitcast[Int8]()
        var d_lo = SIMD[F32, K16](d * Float32(sc[unsafe_offset=0]))
        var d_hi = SIMD[F32, K16](d * Float32(sc[unsafe_offset=1]))
        return ((lo.cast[F32]() - 32) * d_lo, (hi.cast[F32]() - 32) * d_hi)
    elif qtype == "q2_k":
        var d = load_f16_as_f32(sb.unsafe_offset(80))
        var dmin = load_f16_as_f32(sb.unsafe_offset(82))
        var qs = 16 + 32 * (s // 4)
        var shift = 2 * (s % 4)
        var lo = _bits(_u8(sb, qs), shift, 3)
        var hi = _bits(_u8(sb, qs + K16), shift, 3)
        var sc_lo = _byte(sb, 2 * s)
        var sc_hi = _byte(sb, 2 * s + 1)
        return (
            lo.cast[F32]().fma(SIMD[F32, K16](d * Float32(sc_lo & 0xF)), SIMD[F32, K16](-dmin * Float32(sc_lo >> 4))),
            hi.cast[F32]().fma(SIMD[F32, K16](d * Float32(sc_hi & 0xF)), SIMD[F32, K16](-dmin * Float32(sc_hi >> 4))),
        )
    elif qtype == "q3_k":
        var d = load_f16_as_f32(sb.unsafe_offset(108))
        var qs = 32 + 32 * (s // 4)
        var shift = 2 * (s % 4)
        # (q | high << 2) - 4: q when the high bit is set, q - 4 when it is clear.
        var lo = _bits(_u8(sb, qs), shift, 3) | (_bits(_u8(sb, 0), s, 1) << 2)
        var hi = _bits(_u8(sb, qs + K16), shift, 3) | (_bits(_u8(sb, K16), s, 1) << 2)
        var sc = sb.unsafe_offset(96)
        return (
            (lo.cast[F32]() - 4) * SIMD[F32, K16](d * q3_scale(sc, 2 * s)),
            (hi.cast[F32]() - 4) * SIMD[F32, K16](d * q3_scale(sc, 2 * s + 1)),
        )
    else:
        comptime assert False, "not a K-quant"
