# GGUF's non-linear 4-bit formats, read byte for byte as llama.cpp writes them (ggml-common.h, and
# dequantize_row_iq4_nl / _iq4_xs in ggml-quants.c). A 4-bit index picks one of 16 fixed levels
# (KVALUES, denser near zero than Q4_0's even steps), times a scale:
#
#   iq4_nl   18 bytes / 32 values: f16 d, qs[16];  v[j] = d * KVALUES[qs[j] & 0xF],  v[j+16] = d * KVALUES[qs[j] >> 4]
#   iq4_xs  136 bytes / 256 values: f16 d, u16 scales_h, scales_l[4], qs[128]; chunk s (0..7) has the
#            6-bit scale ls = (scales_l[s / 2] >> 4 (s % 2)) & 0xF | ((scales_h >> 2 s) & 3) << 4 and
#            v = d * (ls - 32) * KVALUES[nibble], its nibbles qs[16 s .. 16 s + 15] laid out as iq4_nl's
#
# As for every format (quant.mojo), a chunk decodes into two 16-lane halves: lo = values 0..15 (low
# nibbles), hi = values 16..31 (high nibbles). llama-quantize writes IQ4_XS rows whose width is not a
# multiple of 256 as IQ4_NL, so an IQ4_XS file holds both.

from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget

from .common import BytePtr, F32, load_f16_as_f32

comptime IQ_LANES = 16    # lanes per decoded half (quant.HALF)
comptime IQ4_XS_BYTES = 136
comptime IQ4_XS_QS = 8    # byte offset of qs in an iq4_xs super-block

# The 16 levels (kvalues_iq4nl).
comptime KVALUES = SIMD[DType.int8, IQ_LANES](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def is_iq4[qtype: StaticString]() -> Bool:
    return qtype == "iq4_nl" or qtype == "iq4_xs"


@always_inline
def iq4_levels(q: SIMD[DType.int32, IQ_LANES]) -> SIMD[F32, IQ_LANES]:
    """Float(KVALUES[q & 0xF]) per lane, the upper bits of q ignored.

    x86 with AVX-512: one vpermps (it reads the low 4 bits of each index), as quant.nibble_values.
    AVX2: one pshufb over the int8 levels, then a widening conversion. Elsewhere (baseline x86-64,
    aarch64, GPUs): lane by lane.
    """
    comptime if CompilationTarget.has_avx512f():
        var table = KVALUES.cast[F32]()
        return llvm_intrinsic["llvm.x86.avx512.permvar.sf.512", SIMD[F32, IQ_LANES]](table, q)
    elif CompilationTarget.has_avx2():
        var idx = (q & 0xF).cast[DType.uint8]()
        var v = llvm_intrinsic["llvm.x86.ssse3.pshuf.b.128", SIMD[DType.uint8, IQ_LANES]](
            bitcast[DType.uint8, IQ_LANES](KVALUES), idx)
        return bitcast[DType.int8, IQ_LANES](v).cast[F32]()
    else:
        var out = SIMD[F32, IQ_LANES](0)
        comptime for i in range(IQ_LANES):
            out[i] = Float32(KVALUES[Int(q[i] & 0xF)])
        return out


@always_inline
def iq4_nibbles(p: BytePtr) -> Tuple[SIMD[F32, IQ_LANES], SIMD[F32, IQ_LANES]]:
    """The 32 levels of the 16 nibble bytes at p, unscaled: (low nibbles, high nibbles)."""
    var q = p.unsafe_load[width=IQ_LANES](0).cast[DType.int32]()
    return (iq4_levels(q), iq4_levels(q >> 4))


@always_inline
def iq4_xs_scales(sb: BytePtr) -> SIMD[F32, 8]:
    """All 8 chunk scales of the iq4_xs super-block at sb, d * (ls - 32), in one vector step."""
    comptime U8x8 = SIMD[DType.uint8, 8]
    var l = sb.unsafe_offset(4).unsafe_load[width=8](0)  # scales_l, then 4 bytes of qs (unused)
    var low = (l.shuffle[0, 0, 1, 1, 2, 2, 3, 3]() >> U8x8(0, 4, 0, 4, 0, 4, 0, 4)) & U8x8(0xF)
    var h = SIMD[DType.uint16, 8](UInt16(sb[unsafe_offset=2]) | (UInt16(sb[unsafe_offset=3]) << 8))
    var high = (h >> SIMD[DType.uint16, 8](0, 2, 4, 6, 8, 10, 12, 14)) & SIMD[DType.uint16, 8](3)
    var ls = low.cast[DType.int32]() | (high.cast[DType.int32]() << 4)
    return (ls - 32).cast[F32]() * SIMD[F32, 8](load_f16_as_f32(sb))


@always_inline
def decode_iq4_nl(blk: BytePtr) -> Tuple[SIMD[F32, IQ_LANES], SIMD[F32, IQ_LANES]]:
    """The 32 values of the iq4_nl block at blk."""
    var scale = SIMD[F32, IQ_LANES](load_f16_as_f32(blk))
    var v = iq4_nibbles(blk.unsafe_offset(2))
    return (v[0] * scale, v[1] * scale)


@always_inline
def decode_iq4_xs(sb: BytePtr, s: Int) -> Tuple[SIMD[F32, IQ_LANES], SIMD[F32, IQ_LANES]]:
    """Values 32 s .. 32 s + 31 of the iq4_xs super-block at sb."""
    var scale = SIMD[F32, IQ_LANES](iq4_xs_scales(sb)[s])
    var v = iq4_nibbles(sb.unsafe_offset(IQ4_XS_QS + 16 * s))
    return (v[0] * scale, v[1] * scale)
