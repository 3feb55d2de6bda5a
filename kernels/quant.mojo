# GGUF/ggml block formats, read byte for byte as llama.cpp writes them (ggml-common.h):
#
#   q4_0  18 bytes / 32 values: f16 d, 16 bytes qs;  v[j] = d * ((qs[j] & 0xF) - 8),  v[j+16] = d * ((qs[j] >> 4) - 8)
#   q4_1  20 bytes / 32 values: f16 d, f16 m, 16 bytes qs;  v[j] = d * (qs[j] & 0xF) + m,  v[j+16] = d * (qs[j] >> 4) + m
#   q5_0  22 bytes / 32 values: f16 d, 4 bytes qh, 16 bytes qs;  v[j] = d * ((qs[j] & 0xF | bit j of qh << 4) - 16),
#         v[j+16] = d * ((qs[j] >> 4 | bit j+16 of qh << 4) - 16)
#   q5_1  24 bytes / 32 values: f16 d, f16 m, 4 bytes qh, 16 bytes qs;  as q5_0 without the -16, times d plus m
#   q8_0  34 bytes / 32 values: f16 d, 32 int8 qs;  v[j] = d * qs[j]
#   f16, bf16  2 bytes / 1 value (decoded 32 at a time here, so a "block" is 64 bytes)
#   q2_k .. q6_k  256-value super-blocks (quant_k.mojo), decoded 32 values at a time as well
#   iq4_nl, iq4_xs  non-linear 4-bit levels in 32-value blocks / 256-value super-blocks (quant_iq.mojo)
#
# Blocks are not aligned (18, 20, 22, 34, 110, 210 bytes): every read is an unaligned byte load. A row of K values
# is K / 32 consecutive blocks. Decoding happens in registers, one 32-value block at a time, as two
# 16-lane halves (lo = values 0..15, hi = values 16..31).

from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget

from .common import BytePtr, F32, load_f16_as_f32
from .quant_iq import IQ4_XS_BYTES, decode_iq4_nl, decode_iq4_xs, is_iq4
from .quant_k import KSUBS, QK_K, decode_ksub, is_kquant, kblock_bytes

comptime HALF = 16        # lanes per decoded half-block
comptime QBLOCK = 32      # values per block (f16 is decoded in groups of 32 as well)


def is_super[qtype: StaticString]() -> Bool:
    """Whether a block is a 256-value super-block: the K-quants and IQ4_XS."""
    return is_kquant[qtype]() or qtype == "iq4_xs"


def has_q8_rows[qtype: StaticString]() -> Bool:
    """Whether act = "q8" (int8 activations) exists for the format: the linear block formats, not
    F16 / BF16 (one value per "block") nor the non-linear IQ4 levels."""
    return qtype != "f16" and qtype != "bf16" and qtype != "f32" and not is_iq4[qtype]()


def block_values[qtype: StaticString]() -> Int:
    """Values per block: 256 for the super-blocks, else 32."""
    return QK_K if is_super[qtype]() else QBLOCK


def block_bytes[qtype: StaticString]() -> Int:
    """Bytes that hold one block (block_values values) in this format."""
    comptime if is_kquant[qtype]():
        return kblock_bytes[qtype]()
    elif qtype == "iq4_xs":
        return IQ4_XS_BYTES
    elif qtype == "q4_0" or qtype == "iq4_nl":
        return 18
    elif qtype == "q4_1":
        return 20
    elif qtype == "q5_0":
        return 22
    elif qtype == "q5_1":
        return 24
    elif qtype == "q8_0":
        return 34
    elif qtype == "f16" or qtype == "bf16":
        return 64
    elif qtype == "f32":
        return 128
    else:
        comptime assert False, "unknown qtype: expected q4_0, q4_1, q5_0, q5_1, q8_0, q2_k..q6_k, iq4_nl, iq4_xs, f16, bf16 or f32"


def row_bytes_of[qtype: StaticString](K: Int) -> Int:
    """Bytes of a row of K values (K a multiple of block_values)."""
    return (K // block_values[qtype]()) * block_bytes[qtype]()


@always_inline
def chunk_offset[qtype: StaticString](b: Int) -> Int:
    """Byte offset, within a row, of the block that holds 32-value chunk b."""
    comptime if is_super[qtype]():
        return (b // KSUBS) * block_bytes[qtype]()
    else:
        return b * block_bytes[qtype]()


@always_inline
def decode_chunk[qtype: StaticString](row: BytePtr, b: Int) -> Tuple[SIMD[F32, HALF], SIMD[F32, HALF]]:
    """Decodes values 32 b .. 32 b + 31 of the row at `row` (any format, K-quants included)."""
    comptime if is_kquant[qtype]():
        return decode_ksub[qtype](row.unsafe_offset(chunk_offset[qtype](b)), b % KSUBS)
    elif qtype == "iq4_xs":
        return decode_iq4_xs(row.unsafe_offset(chunk_offset[qtype](b)), b % KSUBS)
    else:
        return decode_block[qtype](row.unsafe_offset(chunk_offset[qtype](b)))


def header_bytes[qtype: StaticString]() -> Int:
    """Bytes of a block's half-precision header before its quants: d (Q4_0, Q8_0) or d and m (Q4_1)."""
    return 4 if qtype == "q4_1" else 2


@always_inline
def block_scales(blk: BytePtr) -> SIMD[F32, 2]:
    """The block's first two halves as floats: (d, m) for Q4_1 (Q4_0 / Q8_0 read d with block_d).

    CPU code only. One 4-byte load and one vector conversion: with two scalar half conversions (as
    load_f16_as_f32 does) the Q4_1 decode loop was markedly slower in cache, because a scalar half
    does not convert in one instruction (from DRAM the same either way). The 4 bytes
    stay inside the block (every header is followed by quant bytes). GPU kernels keep
    load_f16_as_f32: Q4_0 and Q8_0 blocks (18, 34 bytes) leave headers only 2-byte aligned.
    """
    return blk.unsafe_bitcast[Float16]().unsafe_load[width=2](0).cast[F32]()


@always_inline
def block_d[W: Int](blk: BytePtr) -> SIMD[F32, W]:
    """The block's first half (d) as a float in W lanes: Q4_0 / Q8_0's scale. CPU code only.

    One half broadcast from memory (vpbroadcastw) and one conversion. Lane 0 of block_scales compiles
    to a 2-byte insert (vpinsrw) that merges into whichever register LLVM picks, in the Q4_0 decode row
    a live accumulator, so each block's scale waited for the previous block's FMA. With the broadcast
    the Q4_0 row runs as fast as Q4_1 (whose 4-byte header load merges into nothing). Q8_0's float rows
    (dot_block), block decoding and the int8 path's scales read d the same way.
    """
    return SIMD[DType.float16, W](blk.unsafe_bitcast[Float16]()[unsafe_offset=0]).cast[F32]()


@always_inline
def nibble_values[base: Int](q: SIMD[DType.int32, HALF]) -> SIMD[F32, HALF]:
    """Float(base + (q & 0xF)) per lane: a 4-bit quant as a float, base 0 (Q4_1) or -8 (Q4_0).

    CPU decode rows only. With AVX-512 it is one table lookup (vpermps reads just the low 4 bits of
    each index lane, so q needs no mask and the Q4_0 offset sits in the table). Against a mask,
    convert and (for Q4_0) a per-block offset term, the Q4_1 decode loop went from 0.93 to 0.79 ns
    per block (768 x 576, cache-resident, one core).
    """
    comptime if CompilationTarget.has_avx512f() and HALF == 16:
        var table = SIMD[F32, HALF](0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) + Float32(base)
        return llvm_intrinsic["llvm.x86.avx512.permvar.sf.512", SIMD[F32, HALF]](table, q)
    else:
        return ((q & 0xF) + Int32(base)).cast[F32]()


@always_inline
def five_bit_values[base: Int](q: SIMD[DType.int32, HALF]) -> SIMD[F32, HALF]:
    """Float(base + (q & 31)) per lane: a Q5 quant (nibble | fifth bit << 4) as a float, base 0 (Q5_1)
    or -16 (Q5_0). With AVX-512 it is one two-table lookup (vpermt2ps reads the low 5 bits of each
    index lane), as nibble_values is one vpermps; the offset sits in the tables."""
    comptime if CompilationTarget.has_avx512f() and HALF == 16:
        var lo = SIMD[F32, HALF](0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) + Float32(base)
        var hi = lo + 16
        return llvm_intrinsic["llvm.x86.avx512.vpermi2var.ps.512", SIMD[F32, HALF]](lo, q, hi)
    else:
        return ((q & 31) + Int32(base)).cast[F32]()


@always_inline
def decode_block[qtype: StaticString](blk: BytePtr) -> Tuple[SIMD[F32, HALF], SIMD[F32, HALF]]:
    """Decodes one block at `blk` into its 32 float values (lo half, hi half)."""
    comptime if qtype == "q4_0":
        var d = block_d[HALF](blk)
        var q = blk.unsafe_offset(2).unsafe_load[width=HALF](0)
        var lo = ((q & 0xF).cast[DType.int8]() - 8).cast[F32]()
        var hi = ((q >> 4).cast[DType.int8]() - 8).cast[F32]()
        return (lo * d, hi * d)
    elif qtype == "q4_1":
        var dm = block_scales(blk)
        var d = SIMD[F32, HALF](dm[0])
        var m = SIMD[F32, HALF](dm[1])
        var q = blk.unsafe_offset(4).unsafe_load[width=HALF](0)
        return ((q & 0xF).cast[F32]().fma(d, m), (q >> 4).cast[F32]().fma(d, m))
    elif qtype == "q5_0" or qtype == "q5_1":
        comptime q5_1 = qtype == "q5_1"
        comptime qh_at = 4 if q5_1 else 2
        var d = SIMD[F32, HALF](load_f16_as_f32(blk))
        var qh = UInt32(blk[unsafe_offset=qh_at]) | (UInt32(blk[unsafe_offset=qh_at + 1]) << 8) | (
            UInt32(blk[unsafe_offset=qh_at + 2]) << 16) | (UInt32(blk[unsafe_offset=qh_at + 3]) << 24)
        var lanes = SIMD[DType.uint32, HALF](0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
        var high = SIMD[DType.uint32, HALF](qh)
        var q = blk.unsafe_offset(qh_at + 4).unsafe_load[width=HALF](0).cast[DType.uint32]()
        var lo = ((q & 0xF) | (((high >> lanes) & 1) << 4)).cast[F32]()
        var hi = ((q >> 4) | (((high >> (lanes + 16)) & 1) << 4)).cast[F32]()
        comptime if q5_1:
            var m = SIMD[F32, HALF](load_f16_as_f32(blk.unsafe_offset(2)))
            return (lo.fma(d, m), hi.fma(d, m))
        else:
            return ((lo - 16) * d, (hi - 16) * d)
    elif qtype == "iq4_nl":
        return decode_iq4_nl(blk)
    elif qtype == "q8_0":
        var d = block_d[HALF](blk)
        var q0 = blk.unsafe_offset(2).unsafe_load[width=HALF](0)
        var q1 = blk.unsafe_offset(2 + HALF).unsafe_load[width=HALF](0)
        return (bitcast[DType.int8, HALF](q0).cast[F32]() * d, bitcast[DType.int8, HALF](q1).cast[F32]() * d)
    elif qtype == "bf16":
        # bfloat16 is the top half of a float32.
        var h0 = bitcast[DType.uint16, HALF](blk.unsafe_load[width=2 * HALF](0)).cast[DType.uint32]() << 16
        var h1 = bitcast[DType.uint16, HALF](blk.unsafe_offset(2 * HALF).unsafe_load[width=2 * HALF](0)).cast[
            DType.uint32]() << 16
        return (bitcast[F32, HALF](h0), bitcast[F32, HALF](h1))
    elif qtype == "f16":
        var h0 = blk.unsafe_load[width=2 * HALF](0)
        var h1 = blk.unsafe_offset(2 * HALF).unsafe_load[width=2 * HALF](0)
        return (bitcast[DType.float16, HALF](h0).cast[F32](), bitcast[DType.float16, HALF](h1).cast[F32]())
    elif qtype == "f32":
        var lo = blk.unsafe_load[width=4 * HALF](0)
        var hi = blk.unsafe_offset(4 * HALF).unsafe_load[width=4 * HALF](0)
        return (bitcast[F32, HALF](lo), bitcast[F32, HALF](hi))
    else:
        comptime assert False, "unknown qtype"


@always_inline
def dot_block[qtype: StaticString](blk: BytePtr, x0: SIMD[F32, HALF], x1: SIMD[F32, HALF]) -> SIMD[F32, HALF]:
    """Lane-wise partial products of one block with x (sum the lanes for the dot product).

    For Q8_0 the scale is applied once per block to the combined products instead of to every weight.
    (Q4_0/Q4_1 decode rows take their own path in qgemv_rows.mojo, with the offset term per block.)
    """
    comptime if qtype == "q8_0":
        var q0 = blk.unsafe_offset(2).unsafe_load[width=HALF](0)
        var q1 = blk.unsafe_offset(2 + HALF).unsafe_load[width=HALF](0)
        var lo = bitcast[DType.int8, HALF](q0).cast[F32]()
        var hi = bitcast[DType.int8, HALF](q1).cast[F32]()
        return hi.fma(x1, lo * x0) * block_d[HALF](blk)
    else:
        var w = decode_block[qtype](blk)
        return w[1].fma(x1, w[0] * x0)


@always_inline
def dot_chunk[qtype: StaticString](row: BytePtr, b: Int, x0: SIMD[F32, HALF], x1: SIMD[F32, HALF]) -> SIMD[F32, HALF]:
    """dot_block for chunk b of the row at `row`, any format."""
    comptime if is_super[qtype]():
        var w = decode_chunk[qtype](row, b)
        return w[1].fma(x1, w[0] * x0)
    else:
        return dot_block[qtype](row.unsafe_offset(chunk_offset[qtype](b)), x0, x1)


@always_inline
def decode_value[qtype: StaticString](row: BytePtr, i: Int) -> Float32:
    """Value i of a row stored in `qtype` ("f32" or a block format), one scalar at a time (GPU kernels).

    The Q4_0 / Q4_1 / Q8_0 / F16 forms read only the value's bytes; the other formats decode the value's
    32-value chunk and take one lane.
    """
    comptime if qtype == "f32":
        return row.unsafe_bitcast[Float32]()[unsafe_offset=i]
    elif qtype == "f16":
        return load_f16_as_f32(row.unsafe_offset(2 * i))
    elif qtype == "bf16":
        var bits = (UInt32(row[unsafe_offset=2 * i]) | (UInt32(row[unsafe_offset=2 * i + 1]) << 8)) << 16
        return bitcast[F32, 1](bits)
    else:
        var blk = row.unsafe_offset(chunk_offset[qtype](i // QBLOCK))
        var j = i % QBLOCK
        comptime if qtype == "q8_0":
            var q = Int(blk[unsafe_offset=2 + j])
            return load_f16_as_f32(blk) * Float32(q - 256 if q > 127 else q)
        elif qtype == "q4_0":
            var q = Int(blk[unsafe_offset=2 + (j % 16)])
            return load_f16_as_f32(blk) * Float32(((q & 0xF) if j < 16 else (q >> 4)) - 8)
        elif qtype == "q4_1":
            var q = Int(blk[unsafe_offset=4 + (j % 16)])
            return load_f16_as_f32(blk) * Float32((q & 0xF) if j < 16 else (q >> 4)) + load_f16_as_f32(
                blk.unsafe_offset(2))
        else:
            var v = decode_chunk[qtype](row, i // QBLOCK)
            return v[0][j] if j < HALF else v[1][j - HALF]
