# Float-activation batch-1 Q4 rows of crucible.qmatmul on AVX2 without VNNI or AVX-512BW (act = "f32",
# M = 1, Q4_0 / Q4_1): y[n] = x . dequant(W[n, :]), a row read in octets of 8 blocks (256 values), in
# integers.
# Why: the block-at-a-time rows (qgemv_rows.mojo) widen and convert every nibble to float, about half
# the DRAM stream's pace on one core. Here x is held in integers as in qgemv_groups.mojo: per block
# s = max|x| / 127 (part_scale) and three int8 parts, x = s (A + B / 254 + C / 254^2) (int8_parts),
# laid out once per call (octets_layout) in the byte order of qdot_int8.mojo's block octets. Each
# weight octet's nibbles are split once (octet_nibbles) and dotted with all three parts by octet_dot
# (vpmaddubsw, int16 adds, two vphaddw levels, one vpmaddwd): per block and part one int32 sum.
#   - AB = 254 dot(q, A) + dot(q, B) (the 254 is octet_dot's free vpmaddwd factor) stays under 2^24,
#     so its conversion is exact; C's dot is converted apart. Q4_0's -8 terms are added in int32.
#   - t = AB s / 254 + C s / 254^2 per lane, then acc += d t; Q4_1's m term is one FMA with x's block
#     sums per octet.
# Blocks after the last whole octet take decode_block. These rows are compute-bound; accuracy and
# what was tried: docs/kernels.md.

from .common import BytePtr, F32, Ptr
from .qdot_int8 import OCTETS, PAIR, I8Ptr, octet_block, octet_dot, octet_nibbles, octet_scales
from .qgemv_groups import A_MAX, GROUPS_F32, part_scale
from .qgemv_rows import prefetch_ahead
from .quant import QBLOCK, block_bytes, decode_block

# The parts of x (int8_parts): B = the rest of x / s below A's rounding, times 254; C = the rest below
# B's, times 254; x / s = (A 254^2 + B 254 + C) / 254^2. (The AVX-512 group rows split x into base-256
# digits instead, qgemv_groups.int8_digits, whose Horner steps are shifts; here the 254 is octet_dot's
# free vpmaddwd factor.)
comptime PART_SCALE = 254
comptime X_UNIT = Float32(PART_SCALE * PART_SCALE)


def int8_vector(v: SIMD[F32, 16]) -> SIMD[DType.int8, 16]:
    # v holds integers in [-127, 127].
    return v.cast[DType.int32]().cast[DType.int8]()


@always_inline
def int8_parts(v: SIMD[F32, 16], inv: Float32) -> Tuple[SIMD[F32, 16], SIMD[F32, 16], SIMD[F32, 16]]:
    """(A, B, C) of x values v, inv = 1 / s (part_scale): integers in [-127, 127] with
    v / s = A + B / 254 + C / 254^2 to about 2^-24 of 127 (see octets_layout)."""
    var u = v * inv
    var a = u.__round__()
    # u - a and r - bb are exact (Sterbenz); |r|, |(r - bb) 254| <= 127 (the clamps only guard the
    # int8 range).
    var r = (u - a) * Float32(PART_SCALE)
    var bb = min(max(r.__round__(), -A_MAX), A_MAX)
    var c = min(max(((r - bb) * Float32(PART_SCALE)).__round__(), -A_MAX), A_MAX)
    return (a, bb, c)


# AVX-512BW hosts take qgemv_groups.mojo; OCTETS: AVX2 without VNNI (octet_dot's vpmaddubsw form).
comptime OCTETS_F32 = OCTETS and not GROUPS_F32
comptime OCTET_VALUES = 8 * QBLOCK
comptime OCTET_PART_BYTES = 4 * PAIR  # one part of an octet's x: 4 block pairs in qx2 order
comptime OCTET_X_BYTES = 3 * OCTET_PART_BYTES


def octet_xo[qtype: StaticString]() -> Int:
    """Floats per octet in octets_layout's xo: s / 254 and s / 254^2 per lane; Q4_1 then block sums."""
    return 24 if qtype == "q4_1" else 16


def octets_layout[qtype: StaticString](x: Ptr[F32], K: Int, xp: I8Ptr, xo: Ptr[F32], co: Ptr[DType.int32]):
    """Lays x out for qgemv_row_octets, once per call.

    Octet o covers blocks 8 o..8 o + 7; lane k of its per-block vectors is block 8 o + octet_block(k).

    Args:
        x: [K] the activation row.
        K: the row length; octets cover the first (K // 256) * 256 values.
        xp: [octets, 3, 4, 64] int8 out: part P (A, B, C) of pair u (blocks 2 u, 2 u + 1) in the block
            pair order [2u values 0..15, 2u + 1 values 0..15, 2u values 16..31, 2u + 1 values 16..31].
        xo: [octets, octet_xo] out: s / 254 per lane, s / 254^2 per lane, then (Q4_1) the block sums
            of x per lane.
        co: [octets, 2, 8] int32 out (Q4_0): -8 sum(254 A + B) per lane, then -8 sum(C) per lane.
    """
    comptime XO = octet_xo[qtype]()
    for o in range(K // OCTET_VALUES):
        var parts_x = xp.unsafe_offset(o * OCTET_X_BYTES)
        comptime for k in range(8):
            comptime j = octet_block(k)
            var bx = x.unsafe_offset((8 * o + j) * QBLOCK)
            var lo = bx.unsafe_load[width=16](0)
            var hi = bx.unsafe_load[width=16](16)
            var si = part_scale(lo, hi)
            xo[unsafe_offset=o * XO + k] = si[0] / Float32(PART_SCALE)
            xo[unsafe_offset=o * XO + 8 + k] = si[0] / X_UNIT
            var sum_ab = Int32(0)
            var sum_c = Int32(0)
            comptime for h in range(2):
                var abc = int8_parts(lo if h == 0 else hi, si[1])
                # Pair j // 2, half h (bytes 0..31 low values, 32..63 high), block side j % 2.
                comptime at = (j // 2) * PAIR + 32 * h + 16 * (j % 2)
                parts_x.unsafe_offset(at).unsafe_store(0, int8_vector(abc[0]))
                parts_x.unsafe_offset(OCTET_PART_BYTES + at).unsafe_store(0, int8_vector(abc[1]))
                parts_x.unsafe_offset(2 * OCTET_PART_BYTES + at).unsafe_store(0, int8_vector(abc[2]))
                comptime if qtype == "q4_0":
                    sum_ab += (abc[0] * Float32(PART_SCALE) + abc[1]).cast[DType.int32]().reduce_add()
                    sum_c += abc[2].cast[DType.int32]().reduce_add()
            comptime if qtype == "q4_0":
                co[unsafe_offset=o * 16 + k] = -8 * sum_ab
                co[unsafe_offset=o * 16 + 8 + k] = -8 * sum_c
            else:
                xo[unsafe_offset=o * XO + 16 + k] = (lo + hi).reduce_add()


@always_inline
def qgemv_row_octets[qtype: StaticString](
    x: Ptr[F32], xp: I8Ptr, xo: Ptr[F32], co: Ptr[DType.int32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n: Int,
    K: Int, far: Bool = False,
):
    """y[n] = x . dequant(W[n, :]) for one Q4 row; xp, xo, co from octets_layout of x.

    Args:
        x: [K] the activation row (for the blocks after the last whole octet).
        xp: [octets, 3, 4, 64] int8, xo: [octets, octet_xo], co: [octets, 2, 8] (Q4_0) from
            octets_layout.
        w: the weights, rows of row_bytes bytes of GGUF blocks.
        row_bytes: bytes per weight row.
        y: [N] out.
        n: the row.
        K: values per row.
        far: the two-distance prefetch (qgemv_rows.far_prefetch).
    """
    comptime assert qtype == "q4_0" or qtype == "q4_1", "octet rows decode Q4_0 and Q4_1"
    comptime bb = block_bytes[qtype]()
    comptime XO = octet_xo[qtype]()
    var row = w.unsafe_offset(n * row_bytes)
    var acc = SIMD[F32, 8](0)
    var acc_m = SIMD[F32, 8](0)
    var w_lo = Array[SIMD[DType.uint8, 32], 4](fill=SIMD[DType.uint8, 32](0))
    var w_hi = Array[SIMD[DType.uint8, 32], 4](fill=SIMD[DType.uint8, 32](0))
    var octets = K // OCTET_VALUES
    for o in range(octets):
        var blk = row.unsafe_offset(o * 8 * bb)
        comptime for i in range(0, 8 * bb, 64):
            prefetch_ahead(blk.unsafe_offset(i), far)
        octet_nibbles[qtype](blk, w_lo, w_hi)
        var xg = xp.unsafe_offset(o * OCTET_X_BYTES)
        # ab: 254 dot(q, A) + dot(q, B), c: dot(q, C), per block (lane order octet_block).
        var ab = octet_dot[PART_SCALE](w_lo, w_hi, xg) + octet_dot(w_lo, w_hi, xg.unsafe_offset(OCTET_PART_BYTES))
        var c = octet_dot(w_lo, w_hi, xg.unsafe_offset(2 * OCTET_PART_BYTES))
        comptime if qtype == "q4_0":
            ab += co.unsafe_load[width=8](o * 16)
            c += co.unsafe_load[width=8](o * 16 + 8)
        var xs = xo.unsafe_offset(o * XO)
        var t = c.cast[F32]().fma(xs.unsafe_load[width=8](8), ab.cast[F32]() * xs.unsafe_load[width=8](0))
        var dm = octet_scales[qtype](blk)
        acc = t.fma(dm[0], acc)
        comptime if qtype == "q4_1":
            acc_m = dm[1].fma(xs.unsafe_load[width=8](16), acc_m)
    # Blocks after the last whole octet.
    var tail = SIMD[F32, 16](0)
    for b in range(octets * 8, K // QBLOCK):
        var v = decode_block[qtype](row.unsafe_offset(b * bb))
        tail = v[1].fma(x.unsafe_load[width=16](b * QBLOCK + 16), v[0].fma(x.unsafe_load[width=16](b * QBLOCK), tail))
    y[unsafe_offset=n] = (acc + acc_m).reduce_add() + tail.reduce_add()
