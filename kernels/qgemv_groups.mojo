# Float-activation batch-1 Q4 rows of crucible.qmatmul on AVX-512BW (act = "f32", M = 1, Q4_0 / Q4_1):
# y[n] = x . dequant(W[n, :]), a row read in groups of 4 blocks (128 values), in integers.
# Why: the block-at-a-time rows (qgemv_rows.mojo) spend three lane-crossing shuffles per block turning
# nibbles into floats and are compute-bound. Here x is laid out once per call (groups_layout): per
# block s = max|x| / 127 and per value the signed base-256 digits A, B, C of N = round(2^16 x / s)
# (int8_digits), x to about 2^-24 of its block's max|x|. One two-source permute gathers a group's
# 64 packed bytes; low nibbles are a mask, high ones a vgf2p8affineqb (GFNI; else shift and mask);
# vpdpbusd (VNNI; else vpmaddubsw + vpmaddwd) sums nibble x digit into int32, the three digits by
# Horner (shifts by 8), exact. Q4_0 adds -8 sum N in integers (no float cancellation). A set of 4
# groups (16 blocks) finishes together (_set_block_sums): one conversion, one multiply by s / 2^16
# and one FMA by d per set, the headers gathered by two two-source permutes.
# Blocks after the last whole group take decode_block; a last partial set runs with the missing
# groups zero. An inf or NaN in x makes its block's s NaN, so y is NaN as in fp32. AVX2 hosts without
# VNNI take qgemv_octets.mojo, other hosts qgemv_rows. Accuracy and history: docs/kernels.md.

from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget
from std.utils.index import IndexList

from .common import BytePtr, F32, Ptr
from .cpu_tuning import OPAQUE_PERM
from .qdot_int8 import dot_u8_i8_x2
from .qgemv_rows import prefetch_ahead
from .qpair_bytes import opaque_indices, opaque_perm
from .quant import QBLOCK, block_bytes, decode_block, header_bytes

comptime GROUPS_F32 = CompilationTarget.has_avx512f() and CompilationTarget._has_feature["avx512bw"]()
comptime GROUP_BLOCKS = 4
comptime GROUP_VALUES = GROUP_BLOCKS * QBLOCK
comptime SET_GROUPS = 4     # groups whose 16 blocks share one conversion, scale and FMA (LANES / GROUP_BLOCKS)
comptime LANES = 16
comptime GROUP_X = 6       # 64-byte vectors per group in groups_layout's xp: parts A, B, C, low then high halves
comptime A_MAX = 127.0     # |A|, |B|, |C| <= A_MAX: int8
# The group rows' parts (int8_digits): the signed base-256 digits of N = round(2^16 x / s), so
# x / s = (A 2^16 + B 2^8 + C) / 2^16 and the Horner steps are shifts.
comptime DIGIT_BITS = 8
comptime DIGIT_UNIT = Float32(1 << (2 * DIGIT_BITS))
# vgf2p8affineqb matrix (one per qword; result bit i = parity(byte 7 - i of the matrix & x)): bit i <-
# bit i + 4 for i < 4, x >> 4 per byte: a byte's high nibble in one op instead of a shift and a mask.
comptime HIGH_NIBBLE_GFNI = CompilationTarget._has_feature["gfni"]()
comptime _HIGH_NIBBLE_MATRIX = bitcast[DType.uint8, 64](SIMD[DType.uint64, 8](0x1020408000000000))


def byte_perm[qtype: StaticString]() -> Bool:
    """Whether the group rows' word permutes run as hidden byte permutes (VBMI; Q4_0 where
    cpu_tuning.OPAQUE_PERM): vpermt2w / vpermw are 3 / 2 uops there, vpermt2b / vpermb one each."""
    return CompilationTarget._has_feature["avx512vbmi"]() and opaque_perm[qtype]()


def group_sets(K: Int) -> Int:
    """Sets of SET_GROUPS groups in a row of K values, the last one possibly partial."""
    return (K // GROUP_VALUES + SET_GROUPS - 1) // SET_GROUPS


def groups_x_sizes[qtype: StaticString](K: Int) -> Tuple[Int, Int, Int, Int]:
    """Floats of groups_layout's xp, xo, xs, xb for a row of K values (1 where qtype has none)."""
    var groups = K // GROUP_VALUES
    var sets = group_sets(K)
    return (
        groups * GROUP_X * LANES,
        (groups + 1) // 2 * LANES if qtype == "q4_0" else 1,
        sets * LANES,
        sets * LANES if qtype == "q4_1" else 1,
    )


@always_inline
def _quad_sums[dtype: DType](v: SIMD[dtype, 16]) -> SIMD[dtype, 4]:
    """[v[0:4].sum(), v[4:8].sum(), v[8:12].sum(), v[12:16].sum()]."""
    var pairs = v.deinterleave()
    var p = pairs[0] + pairs[1]
    var quads = p.deinterleave()
    return quads[0] + quads[1]


def part_scale(lo: SIMD[F32, 16], hi: SIMD[F32, 16]) -> Tuple[Float32, Float32]:
    """(s, 1 / s) of the block [lo, hi]: s = max|x| / 127, the unit of its part A.

    A block whose largest |x| is under 1e-30 counts as zero (1 / s could overflow): an absolute error
    under 32e-30 max|w|. An inf or NaN in x makes s NaN, so y is NaN as in fp32 (x * 0 is NaN exactly
    for them; max() alone could drop a NaN).
    """
    var amax = max(abs(lo).reduce_max(), abs(hi).reduce_max())
    var inv = Float32(A_MAX) / amax if amax > 1e-30 else Float32(0)
    var poison = (lo * 0.0 + hi * 0.0).reduce_add()
    return (amax / A_MAX + poison, inv)


@always_inline
def int8_digits(v: SIMD[F32, 16], inv: Float32) -> Tuple[SIMD[DType.int32, 16], SIMD[DType.int32, 16], SIMD[DType.int32, 16], SIMD[DType.int32, 16]]:
    """(A, B, C, N) of x values v, inv = 1 / s (part_scale): N = round(2^16 v / s), |N| <= 127 2^16,
    and its signed base-256 digits, N = A 2^16 + B 2^8 + C exactly, B and C in [-128, 127] and A in
    [-127, 127] (|N| / 2^16 plus at most 128.5 / 256)."""
    var n = (v * inv * DIGIT_UNIT).__round__().cast[DType.int32]()
    var c = ((n + 128) & 255) - 128
    var n1 = (n - c) >> DIGIT_BITS
    var b = ((n1 + 128) & 255) - 128
    var a = (n1 - b) >> DIGIT_BITS
    return (a, b, c, n)


def groups_layout[qtype: StaticString](x: Ptr[F32], K: Int, xp: Ptr[F32], xo: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32]):
    """Lays x out for qgemv_row_groups, once per call.

    Per block of 32 values: s = max|x| / 127 and, per value, N = round(2^16 x / s) (|N| <= 127 2^16) in
    three int8 parts, its signed base-256 digits A, B, C (int8_digits): x / s = (A 2^16 + B 2^8 + C) / 2^16
    to within 2^-17 plus the rounding of x / s: x to about 2^-24 of the block's max|x| (fp32: 2^-24
    of each |x|).

    Vector 2 p + h of a group holds part p of the 4 blocks' low (h = 0: values 0..15) or high (h = 1:
    values 16..31) halves, block b in bytes 16 b..16 b + 15: the order of a group's packed nibbles (the
    low nibble of byte i is value i, the high one value i + 16). Lane i (of 16 int32 sums) covers bytes
    4 i..4 i + 3 of both halves: 8 values of block i // 4.

    The per-block vectors of a set of 4 groups (xs, xb) hold block b of the set's group g in lane
    4 b + g, the order in which qgemv_row_groups sums a set's lanes (_set_block_sums); lanes of groups
    past the row's last (a partial last set) are 0.

    Args:
        x: [K] the activation row.
        K: the row length; groups cover the first (K // 128) * 128 values.
        xp: [groups, 6, 64] int8 out (in [groups, GROUP_X, 16] floats' bits).
        xo: [ceil(groups / 2), 16] out, Q4_0 only: per lane -8 sum N (int32 bits) of groups 2 j and
            2 j + 1, added as _pair_sums adds the groups' products.
        xs: [sets, 16] out: s / 2^16 per block.
        xb: [sets, 16] out, Q4_1 only: per block sum x (its m term).
    """
    var groups = K // GROUP_VALUES
    for i in range(group_sets(K) * LANES):
        xs[unsafe_offset=i] = 0
        comptime if qtype == "q4_1":
            xb[unsafe_offset=i] = 0
    var even_offset = SIMD[DType.int32, LANES](0)
    for g in range(groups):
        var gx = x.unsafe_offset(g * GROUP_VALUES)
        var set_lanes = (g // SET_GROUPS) * LANES + g % SET_GROUPS  # lane 4 b + g of the set's vectors
        var offset = SIMD[DType.int32, LANES](0)
        var parts = Array[SIMD[DType.int8, 64], GROUP_X](fill=SIMD[DType.int8, 64](0))
        comptime for b in range(GROUP_BLOCKS):
            var lo = gx.unsafe_load[width=16](b * QBLOCK)
            var hi = gx.unsafe_load[width=16](b * QBLOCK + 16)
            var si = part_scale(lo, hi)
            xs[unsafe_offset=set_lanes + 4 * b] = si[0] / DIGIT_UNIT
            comptime if qtype == "q4_1":
                xb[unsafe_offset=set_lanes + 4 * b] = (lo + hi).reduce_add()
            var whole_sum = SIMD[DType.int32, 16](0)
            comptime for h in range(2):
                var digits = int8_digits(lo if h == 0 else hi, si[1])
                comptime for p in range(3):
                    parts[2 * p + h] = parts[2 * p + h].insert[offset=16 * b](digits[p].cast[DType.int8]())
                comptime if qtype == "q4_0":
                    whole_sum += digits[3]
            # Lane 4 b + j: values 4 j..4 j + 3 of both halves.
            comptime if qtype == "q4_0":
                offset = offset.insert[offset=4 * b](_quad_sums(whole_sum))
        comptime for p in range(GROUP_X):
            xp.unsafe_store((g * GROUP_X + p) * LANES, bitcast[F32, LANES](parts[p]))
        comptime if qtype == "q4_0":
            # Groups 2 j and 2 j + 1 in _pair_sums' order (a missing partner: zeros).
            if g % 2 == 0:
                even_offset = -8 * offset
                if g == groups - 1:
                    xo.unsafe_store((g // 2) * LANES, bitcast[F32, LANES](_pair_sums(even_offset, SIMD[DType.int32, LANES](0))))
            else:
                xo.unsafe_store((g // 2) * LANES, bitcast[F32, LANES](_pair_sums(even_offset, -8 * offset)))


def _packed_perm[qtype: StaticString]() -> SIMD[DType.int16, 32]:
    # Word indices of a two-source permute: window 0 = the group's bytes [0, 64) (words 0..31),
    # window 1 = bytes [4 bb - 64, 4 bb) (words 32..63). Word i <- block i // 8, packed word i % 8.
    comptime bb = block_bytes[qtype]()
    comptime head = header_bytes[qtype]()
    comptime assert bb % 2 == 0 and head % 2 == 0, "word permutes need even block and header sizes"
    comptime assert bb + head + 16 <= 64 and 2 * bb + head >= 4 * bb - 64, "blocks 0-1 in window 0, 2-3 in 1"
    var idx = SIMD[DType.int16, 32](0)
    for i in range(32):
        var b = i // 8
        var off = b * bb + head + 2 * (i % 8)
        idx[i] = Int16(off // 2 if b < 2 else 32 + (off - (4 * bb - 64)) // 2)
    return idx


def _pair_header_perm[qtype: StaticString, pair: Int]() -> SIMD[DType.int16, 32]:
    # Two-source word permute of groups 2 pair (window 0: words 0..31) and 2 pair + 1 (words 32..63)
    # of a set: word 4 b + i <- d of group i's block b, word 16 + 4 b + i <- its m (Q4_1), the set's lane
    # order (groups_layout). The other pair's words are taken from the other permute (_PAIR_MASK).
    comptime bb = block_bytes[qtype]()
    var idx = SIMD[DType.int16, 32](0)
    for j in range(2):
        for b in range(GROUP_BLOCKS):
            var i = 2 * pair + j
            idx[GROUP_BLOCKS * b + i] = Int16(32 * j + b * bb // 2)
            idx[LANES + GROUP_BLOCKS * b + i] = Int16(32 * j + b * bb // 2 + 1)
    return idx


def _pair_mask() -> SIMD[DType.bool, 32]:
    # The words of groups 2 and 3 of a set (lanes 4 b + 2, 4 b + 3 of both halves).
    var mask = SIMD[DType.bool, 32](fill=False)
    for l in range(32):
        mask[l] = (l % GROUP_BLOCKS) >= 2
    return mask


def _unpack_mask[width: Int, high: Bool]() -> IndexList[LANES]:
    # vpunpck{l,h}{dq,qdq} over (a ++ b), 16 x 32-bit lanes: per 128-bit lane k, pairs of `width`
    # lanes (1: dwords, 2: qwords) taken alternately from a and b, from the low or high half.
    var m = IndexList[LANES]()
    for l in range(LANES):
        var k = l // 4
        var j = l % 4
        var src = (j // width) % 2           # 0: a, 1: b
        var pos = 4 * k + (2 if high else 0) + (j // (2 * width)) * width + j % width
        m[l] = pos + LANES * src
    return m


def _word_bytes(words: SIMD[DType.int16, 32]) -> SIMD[DType.uint8, 64]:
    """The byte indices of a word permute: byte 2 i + j <- byte 2 words[i] + j."""
    var idx = SIMD[DType.uint8, 64](0)
    for i in range(64):
        idx[i] = UInt8(2 * Int(words[i // 2]) + i % 2)
    return idx


comptime _PACKED_PERM[qtype: StaticString] = _packed_perm[qtype]()
comptime _PAIR_HEADER_PERM[qtype: StaticString, pair: Int] = _pair_header_perm[qtype, pair]()
comptime _PAIR_MASK = _pair_mask()
comptime _UNPACK[width: Int, high: Bool] = _unpack_mask[width, high]()


@always_inline
def _word_permute2[as_bytes: Bool, words: SIMD[DType.int16, 32]](
    a: SIMD[DType.int16, 32], b: SIMD[DType.int16, 32]
) -> SIMD[DType.int16, 32]:
    """Word i of the result: word words[i] of a ++ b (vpermt2w); with as_bytes the same move as a
    vpermt2b behind opaque indices (one uop against three where OPAQUE_PERM): LLVM turns visible
    byte indices that move whole words back into vpermt2w."""
    comptime if as_bytes:
        comptime idx = _word_bytes(words)
        return bitcast[DType.int16, 32](llvm_intrinsic["llvm.x86.avx512.vpermi2var.qi.512", SIMD[DType.uint8, 64]](
            bitcast[DType.uint8, 64](a), opaque_indices[True](idx), bitcast[DType.uint8, 64](b)))
    return llvm_intrinsic["llvm.x86.avx512.vpermi2var.hi.512", SIMD[DType.int16, 32]](a, words, b)


@always_inline
def _dot_halves(
    acc: SIMD[DType.int32, LANES], lo: SIMD[DType.uint8, 64], hi: SIMD[DType.uint8, 64], x_lo: SIMD[DType.int8, 64],
    x_hi: SIMD[DType.int8, 64],
) -> SIMD[DType.int32, LANES]:
    """acc[i] + the sum over bytes 4 i..4 i + 3 of lo x_lo + hi x_hi; lo, hi nibbles (<= 15), exact."""
    comptime if CompilationTarget.has_vnni():
        return dot_u8_i8_x2[15](dot_u8_i8_x2[15](acc, lo, x_lo), hi, x_hi)
    # AVX-512BW without VNNI: vpmaddubsw's int16 pair sums of both halves added as int16 (4 products,
    # at most 4 * 15 * 128 < 2^15: no saturation), then one vpmaddwd against ones.
    var pairs = llvm_intrinsic["llvm.x86.avx512.pmaddubs.w.512", SIMD[DType.int16, 32]](lo, x_lo) + llvm_intrinsic[
        "llvm.x86.avx512.pmaddubs.w.512", SIMD[DType.int16, 32]](hi, x_hi)
    var ones = SIMD[DType.int16, 32](1)
    return acc + llvm_intrinsic["llvm.x86.avx512.pmaddw.d.512", SIMD[DType.int32, LANES]](pairs, ones)


@always_inline
def _group_nibbles[qtype: StaticString](
    blk: BytePtr, far: Bool
) -> Tuple[SIMD[DType.uint8, 64], SIMD[DType.uint8, 64], SIMD[DType.int16, 32]]:
    """(lo, hi, window 0) of the group at `blk`: byte i of lo / hi is the low / high nibble of the
    group's packed byte i (value i % 16 / 16 + i % 16 of block i // 16); window 0 (the group's first
    64 bytes) holds its 4 headers."""
    comptime bb = block_bytes[qtype]()
    # A group spans 72-80 bytes: two lines ahead cover its stream.
    prefetch_ahead(blk, far)
    prefetch_ahead(blk.unsafe_offset(64), far)
    var win0 = bitcast[DType.int16, 32](blk.unsafe_load[width=64](0))
    var win1 = bitcast[DType.int16, 32](blk.unsafe_offset(4 * bb - 64).unsafe_load[width=64](0))
    var words = bitcast[DType.uint16, 32](_word_permute2[byte_perm[qtype](), _PACKED_PERM[qtype]](win0, win1))
    var lo = bitcast[DType.uint8, 64](words & UInt16(0x0F0F))
    var hi: SIMD[DType.uint8, 64]
    comptime if HIGH_NIBBLE_GFNI:
        hi = llvm_intrinsic["llvm.x86.vgf2p8affineqb.512", SIMD[DType.uint8, 64]](
            bitcast[DType.uint8, 64](words), _HIGH_NIBBLE_MATRIX, Int8(0))
    else:
        hi = bitcast[DType.uint8, 64]((words >> UInt16(4)) & UInt16(0x0F0F))
    return (lo, hi, win0)


@always_inline
def _pair_headers[qtype: StaticString, pair: Int](
    win_a: SIMD[DType.int16, 32], win_b: SIMD[DType.int16, 32]
) -> SIMD[DType.int16, 32]:
    """The headers of a set's groups 2 pair and 2 pair + 1 (first windows win_a, win_b) in the set's
    lanes (_pair_header_perm), as hidden byte permutes where VBMI and OPAQUE_PERM, for both formats."""
    comptime as_bytes = CompilationTarget._has_feature["avx512vbmi"]() and OPAQUE_PERM
    return _word_permute2[as_bytes, _PAIR_HEADER_PERM[qtype, pair]](win_a, win_b)


@always_inline
def _pair_sums(a: SIMD[DType.int32, LANES], b: SIMD[DType.int32, LANES]) -> SIMD[DType.int32, LANES]:
    """Stage 1 of _set_block_sums for groups a, b: per 128-bit lane k (block k), [a 4k + a 4k+2,
    b 4k + b 4k+2, a 4k+1 + a 4k+3, b 4k+1 + b 4k+3] (vpunpck{l,h}dq and an add)."""
    return a.shuffle[_UNPACK[1, False]](b) + a.shuffle[_UNPACK[1, True]](b)


@always_inline
def _set_block_sums(t01: SIMD[DType.int32, LANES], t23: SIMD[DType.int32, LANES]) -> SIMD[F32, LANES]:
    """Lane 4 b + g: the sum of group g's lanes 4 b..4 b + 3 (block b), as a float, from the stage-1
    sums of groups 0, 1 (t01) and 2, 3 (t23) (_pair_sums).

    Two stages of in-lane unpacks and adds (vpunpck{l,h}dq, then {l,h}qdq): the 4 groups' 64 lane sums
    become one vector, so one conversion, one multiply by s and one FMA by d serve the set instead of
    one of each per group. Stage 1 adds in int32 (16 values: at most 16 * 15 * 127 2^16 < 2^31),
    stage 2 in floats (32 values could pass 2^31); each rounds once, as the lane sums did.
    """
    var f01 = t01.cast[F32]()
    var f23 = t23.cast[F32]()
    return f01.shuffle[_UNPACK[2, False]](f23) + f01.shuffle[_UNPACK[2, True]](f23)


@always_inline
def _set[qtype: StaticString, whole: Bool](
    row: BytePtr, xp: Ptr[F32], xo: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32], set: Int, count: Int,
    acc: SIMD[F32, LANES], acc_m: SIMD[F32, LANES], far: Bool,
) -> Tuple[SIMD[F32, LANES], SIMD[F32, LANES]]:
    """(acc, acc_m) plus the products of set `set`'s groups (whole: all SET_GROUPS, else the first
    `count`): acc gains d s (x . q) / s per block, acc_m Q4_1's m (sum x) per block."""
    comptime bb = block_bytes[qtype]()
    var g0 = set * SET_GROUPS
    var lo = Array[SIMD[DType.uint8, 64], SET_GROUPS](fill=SIMD[DType.uint8, 64](0))
    var hi = Array[SIMD[DType.uint8, 64], SET_GROUPS](fill=SIMD[DType.uint8, 64](0))
    # The missing groups of a partial set keep zero nibbles and headers: they add 0 d 0.
    var win0 = Array[SIMD[DType.int16, 32], SET_GROUPS](fill=SIMD[DType.int16, 32](0))
    comptime for i in range(SET_GROUPS):
        if whole or i < count:
            var r = _group_nibbles[qtype](row.unsafe_offset((g0 + i) * GROUP_BLOCKS * bb), far)
            lo[i] = r[0]
            hi[i] = r[1]
            win0[i] = r[2]
    var heads = _PAIR_MASK.select(_pair_headers[qtype, 1](win0[2], win0[3]), _pair_headers[qtype, 0](win0[0], win0[1]))
    # Per lane (8 values) sum q N (N = A 2^16 + B 2^8 + C), by Horner over the parts, the 4 groups in
    # lockstep (independent chains side by side: one group's chain is 6 dependent vpdpbusd): at most
    # 8 * 15 * 127 * 2^16 < 2^30, exact in int32. Q4_0 then adds -8 sum N: the sum over q - 8, exact,
    # with no cancellation in floats.
    var ints = Array[SIMD[DType.int32, LANES], SET_GROUPS](fill=SIMD[DType.int32, LANES](0))
    comptime for p in range(3):
        comptime for i in range(SET_GROUPS):
            if whole or i < count:
                var xg = xp.unsafe_offset(((g0 + i) * GROUP_X + 2 * p) * LANES)
                comptime if p > 0:
                    ints[i] = ints[i] << DIGIT_BITS
                ints[i] = _dot_halves(ints[i], lo[i], hi[i], bitcast[DType.int8, 64](xg.unsafe_load[width=LANES](0)),
                                      bitcast[DType.int8, 64](xg.unsafe_load[width=LANES](LANES)))
    var t01 = _pair_sums(ints[0], ints[1])
    var t23 = _pair_sums(ints[2], ints[3])
    comptime if qtype == "q4_0":
        # The offsets -8 sum N, laid out in the stage-1 order (groups_layout): two adds per set.
        t01 += bitcast[DType.int32, LANES](xo.unsafe_load[width=LANES](2 * set * LANES))
        if whole or count > 2:
            t23 += bitcast[DType.int32, LANES](xo.unsafe_load[width=LANES]((2 * set + 1) * LANES))
    var halves = bitcast[DType.float16, 32](heads)
    var t = _set_block_sums(t01, t23) * xs.unsafe_load[width=LANES](set * LANES)
    var new_acc = halves.slice[LANES, offset=0]().cast[F32]().fma(t, acc)
    comptime if qtype == "q4_1":
        return (new_acc, halves.slice[LANES, offset=LANES]().cast[F32]().fma(xb.unsafe_load[width=LANES](set * LANES), acc_m))
    return (new_acc, acc_m)


@always_inline
def qgemv_row_groups[qtype: StaticString](
    x: Ptr[F32], xp: Ptr[F32], xo: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32],
    n: Int, K: Int, far: Bool = False,
):
    """y[n] = x . dequant(W[n, :]) for one Q4 row; xp, xo, xs, xb from groups_layout of x.

    Args:
        x: [K] the activation row (for the blocks after the last whole group).
        xp: [groups, GROUP_X, 16], xo: [ceil(groups / 2), 16] (Q4_0), xs: [sets, 16], xb: [sets, 16] (Q4_1)
            from groups_layout.
        w: the weights, rows of row_bytes bytes of GGUF blocks.
        row_bytes: bytes per weight row.
        y: [N] out.
        n: the row.
        K: values per row.
        far: the two-distance prefetch (qgemv_rows.far_prefetch).
    """
    comptime assert qtype == "q4_0" or qtype == "q4_1", "group rows decode Q4_0 and Q4_1"
    comptime bb = block_bytes[qtype]()
    var row = w.unsafe_offset(n * row_bytes)
    var groups = K // GROUP_VALUES
    var acc = SIMD[F32, LANES](0)
    var acc_m = SIMD[F32, LANES](0)
    var s = 0
    while (s + 1) * SET_GROUPS <= groups:
        var r = _set[qtype, True](row, xp, xo, xs, xb, s, SET_GROUPS, acc, acc_m, far)
        acc = r[0]
        acc_m = r[1]
        s += 1
    if s * SET_GROUPS < groups:
        var r = _set[qtype, False](row, xp, xo, xs, xb, s, groups - s * SET_GROUPS, acc, acc_m, far)
        acc = r[0]
        acc_m = r[1]
    # Blocks after the last whole group.
    var tail = SIMD[F32, LANES](0)
    for b in range(groups * GROUP_BLOCKS, K // QBLOCK):
        var v = decode_block[qtype](row.unsafe_offset(b * bb))
        tail = v[1].fma(x.unsafe_load[width=LANES](b * QBLOCK + LANES), v[0].fma(x.unsafe_load[width=LANES](b * QBLOCK), tail))
    y[unsafe_offset=n] = (acc + acc_m + tail).reduce_add()
