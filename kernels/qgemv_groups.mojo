# Float-activation batch-1 Q4 rows of crucible.qmatmul on AVX-512BW (act = "f32", M = 1, Q4_0 / Q4_1):
# y[n] = x . dequant(W[n, :]), a row read in groups of 4 blocks (128 values), in integers.
#
# Why: the block-at-a-time rows (qgemv_rows.mojo) turn each nibble into a float with a widening
# (vpmovzxbd) and a table permute (vpermps): three lane-crossing shuffles per block on Zen 4's two
# shuffle pipes, compute-bound at ~1.6 ns per block on one core. Here:
#   - x is laid out once per call (groups_layout): per block of 32 values, s = max|x| / 127 and three
#     int8 parts, x = s (A + B / 254 + C / 254^2), to about 2^-24 of the block's max|x|, in the order
#     the nibbles come out below;
#   - one two-source word permute gathers a group's 4 x 16 packed bytes into 64 (bytes 16 b..16 b + 15:
#     block b), one more moves the 4 headers in front, 4 lanes each;
#   - the low nibbles are one mask, the high ones a shift and a mask (3 ops for 128 values), and
#     vpdpbusd (VNNI; without it vpmaddubsw on both halves, an int16 add and vpmaddwd) sums nibble x
#     part per 4 bytes into int32. The three parts go in by Horner (times 254, then the next part):
#     per lane (8 values) under 2^30, exact. Q4_0 then adds -8 sum (A 254^2 + B 254 + C): a sum over
#     q - 8 with no cancellation. Then t = acc s / 254^2 per lane, and acc += d t. Q4_1's m term: the
#     m of 4 groups (16 blocks) are gathered by the groups' own header permutes (merge-masked), then
#     one conversion and one FMA with x's block sums.
#
# Accuracy (conformance grid, M = 1, largest ratio of the error to the fp32 dot bound
# 2 u sqrt(K) |x| . |w|): K = 576 Q4_0 0.010, Q4_1 0.020; K = 4096 0.002 / 0.006. x with a block
# mixing 1e4 and 1e-3 (the grid's special-x case, split bound |d q| + |offset|): Q4_0 0.08-0.09, Q4_1
# 0.32-0.33. Small values next to a large one carry its 2^-24 error, where fp32 keeps 2^-24 of each
# value: the price of x in integers per block, in a bound with room to spare. A block whose max|x| is
# under 1e-30 counts as zero; an inf or NaN in x makes its s NaN, so y is NaN as in fp32.
#
# History, Zen 4, one core, cache-resident (benchmarks/profile_qmatmul.mojo "f32 group rows", 128 x 4096):
#   - float nibbles (16 x F - 16 x with F = 1 + q / 16, in FMAs): Q4_0 1.30-1.43, Q4_1 1.36-1.45 ns per
#     block; its cancellation failed the special-x case for Q4_0 at 7.7 times the bound on |w|;
#   - nibbles as bf16 with vdpbf16ps and x in two bf16 parts: 1.07 / 1.13, but x held only ~17 bits (grid
#     ratio 0.76 at K = 160); in three parts (24 bits) 1.35;
#   - x in two int16 parts, x = s (H + L / 2^15), and vpdpwssd: 8 multiply-adds, 6 nibble ops and 8
#     loads of x per group against 6, 3 and 6 here (Zen 4 loads 2 x 32 bytes per cycle). Q4_0
#     1.15-1.36 -> 0.93-1.09, Q4_1 1.08-1.18 -> 0.93-1.13 ns per block; grid ratios 0.007 / 0.018 at
#     K = 576 and 0.08 / 0.10 on special-x. In a graph, chains of copies from DRAM, 8 interleaved rounds,
#     medians per op: K = N = 4096 Q4_0 520.8 -> 471.5 us (faster in 8 of 8 rounds), Q4_1 552.3 -> 509.4
#     (7 of 8); at SmolLM2's shapes (K = 576 or 1536) within the noise of memory that read 10-16 GB/s.
#     The no-VNNI branch, forced on this Zen 4: 1.07-1.12 / 1.10-1.30 (int16 parts there: 1.15-1.33 /
#     1.07-1.27); through dot_u8_i8_x2's 256-bit halves it took 1.48-1.72.
#   - two rows side by side, sharing x's loads: Q4_0 3-10% faster in cache, Q4_1 slower (registers); not
#     kept (one weight stream per core, see qmatmul_cpu._qgemv_m).
# Blocks after the last whole group (K = 576: 2 of 18) take decode_block. Needs AVX-512BW (word
# permutes and shifts); AVX2 hosts without VNNI take qgemv_octets.mojo (the same parts of x, 8 blocks
# at a time), other hosts keep qgemv_rows.

from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget

from .common import BytePtr, F32, Ptr
from .qdot_int8 import dot_u8_i8_x2
from .qgemv_rows import block_sums, prefetch_ahead
from .qpair_bytes import opaque_indices, opaque_perm, permute_bytes
from .quant import QBLOCK, block_bytes, decode_block, header_bytes

comptime GROUPS_F32 = CompilationTarget.has_avx512f() and CompilationTarget._has_feature["avx512bw"]()
comptime GROUP_BLOCKS = 4
comptime GROUP_VALUES = GROUP_BLOCKS * QBLOCK
comptime SET_GROUPS = 4     # Q4_1: groups whose 16 m share one conversion (LANES / GROUP_BLOCKS)
comptime LANES = 16
comptime GROUP_X = 6       # 64-byte vectors per group in groups_layout's xp: parts A, B, C, low then high halves
comptime A_MAX = 127.0     # |A|, |B|, |C| <= A_MAX: int8
comptime PART_SCALE = 254  # B = the rest of x / s below A's rounding, times 254; C = the rest below B's, times 254
comptime X_UNIT = Float32(PART_SCALE * PART_SCALE)  # x / s = (A 254^2 + B 254 + C) / 254^2


def byte_perm[qtype: StaticString]() -> Bool:
    """Whether the group rows' word permutes run as hidden byte permutes (VBMI; Q4_0 on Intel, see
    qpair_bytes.OPAQUE_PERM): vpermt2w / vpermw are 3 / 2 uops there, vpermt2b / vpermb one each."""
    return CompilationTarget._has_feature["avx512vbmi"]() and opaque_perm[qtype]()


def group_xc[qtype: StaticString]() -> Int:
    """16-float vectors per group in groups_layout's xc: s / 254^2 per lane, then Q4_0's offset sums."""
    return 2 if qtype == "q4_0" else 1


def int8_vector(v: SIMD[F32, 16]) -> SIMD[DType.int8, 16]:
    # v holds integers in [-127, 127].
    return v.cast[DType.int32]().cast[DType.int8]()


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
def int8_parts(v: SIMD[F32, 16], inv: Float32) -> Tuple[SIMD[F32, 16], SIMD[F32, 16], SIMD[F32, 16]]:
    """(A, B, C) of x values v, inv = 1 / s (part_scale): integers in [-127, 127] with
    v / s = A + B / 254 + C / 254^2 to about 2^-24 of 127 (see groups_layout)."""
    var u = v * inv
    var a = u.__round__()
    # u - a and r - bb are exact (Sterbenz); |r|, |(r - bb) 254| <= 127 (the clamps only guard the
    # int8 range).
    var r = (u - a) * Float32(PART_SCALE)
    var bb = min(max(r.__round__(), -A_MAX), A_MAX)
    var c = min(max(((r - bb) * Float32(PART_SCALE)).__round__(), -A_MAX), A_MAX)
    return (a, bb, c)


def groups_layout[qtype: StaticString](x: Ptr[F32], K: Int, xp: Ptr[F32], xc: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32]):
    """Lays x out for qgemv_row_groups, once per call.

    Per block of 32 values: s = max|x| / 127, u = x / s, and three int8 parts: A = round(u),
    r = (u - A) 254, B = round(r), C = round((r - B) 254), all in [-127, 127] since |u - A| <= 1/2 and
    |r - B| <= 1/2, so u = A + B / 254 + C / 254^2 to within 1 / (2 254^2) plus the roundings of u and r:
    x to about 2^-24 of the block's max|x| (fp32: 2^-24 of each |x|).

    Vector 2 p + h of a group holds part p of the 4 blocks' low (h = 0: values 0..15) or high (h = 1:
    values 16..31) halves, block b in bytes 16 b..16 b + 15: the order of a group's packed nibbles (the
    low nibble of byte i is value i, the high one value i + 16). Lane i (of 16 int32 sums) covers bytes
    4 i..4 i + 3 of both halves: 8 values of block i // 4.

    Args:
        x: [K] the activation row.
        K: the row length; groups cover the first (K // 128) * 128 values.
        xp: [groups, 6, 64] int8 out (in [groups, GROUP_X, 16] floats' bits).
        xc: [groups, group_xc, 16] out: s / 254^2 per lane, then Q4_0's per lane
            -8 sum (A 254^2 + B 254 + C) (int32 bits).
        xs: [groups, 16] out: per lane sum x (Q4_1's m term, groups outside whole sets); Q4_1 only.
        xb: [K // 32] out: per block sum x (Q4_1's m term, sets of 4 groups); Q4_1 only.
    """
    comptime if qtype == "q4_1":
        block_sums(x, K // QBLOCK, xb)
    for g in range(K // GROUP_VALUES):
        var gx = x.unsafe_offset(g * GROUP_VALUES)
        var scale = SIMD[F32, LANES](0)
        var offset = SIMD[DType.int32, LANES](0)
        var lane_x = SIMD[F32, LANES](0)
        var parts = Array[SIMD[DType.int8, 64], GROUP_X](fill=SIMD[DType.int8, 64](0))
        comptime for b in range(GROUP_BLOCKS):
            var lo = gx.unsafe_load[width=16](b * QBLOCK)
            var hi = gx.unsafe_load[width=16](b * QBLOCK + 16)
            var si = part_scale(lo, hi)
            scale = scale.insert[offset=4 * b](SIMD[F32, 4](si[0] / X_UNIT))
            var whole_sum = SIMD[DType.int32, 16](0)
            comptime for h in range(2):
                var abc = int8_parts(lo if h == 0 else hi, si[1])
                var a = abc[0]
                var bb = abc[1]
                var c = abc[2]
                parts[h] = parts[h].insert[offset=16 * b](int8_vector(a))
                parts[2 + h] = parts[2 + h].insert[offset=16 * b](int8_vector(bb))
                parts[4 + h] = parts[4 + h].insert[offset=16 * b](int8_vector(c))
                comptime if qtype == "q4_0":
                    whole_sum += (a.cast[DType.int32]() * PART_SCALE + bb.cast[DType.int32]()) * PART_SCALE + c.cast[
                        DType.int32]()
            # Lane 4 b + j: values 4 j..4 j + 3 of both halves.
            comptime if qtype == "q4_0":
                offset = offset.insert[offset=4 * b](_quad_sums(whole_sum))
            else:
                lane_x = lane_x.insert[offset=4 * b](_quad_sums(lo + hi))
        comptime for p in range(GROUP_X):
            xp.unsafe_store((g * GROUP_X + p) * LANES, bitcast[F32, LANES](parts[p]))
        comptime xcn = group_xc[qtype]()
        xc.unsafe_store(g * xcn * LANES, scale)
        comptime if qtype == "q4_1":
            xs.unsafe_store(g * LANES, lane_x)
        else:
            xc.unsafe_store((g * xcn + 1) * LANES, bitcast[F32, LANES](-8 * offset))


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


def _header_perm[qtype: StaticString]() -> SIMD[DType.int16, 32]:
    # Word l < 16 <- d of block l // 4; word 16 + l <- m of block l // 4 (Q4_1; Q4_0 ignores them).
    comptime bb = block_bytes[qtype]()
    var idx = SIMD[DType.int16, 32](0)
    for lane in range(LANES):
        idx[lane] = Int16((lane // 4) * bb // 2)
        idx[LANES + lane] = Int16((lane // 4) * bb // 2 + 1)
    return idx


def _set_header_perm[qtype: StaticString, i: Int]() -> SIMD[DType.int16, 32]:
    # As _header_perm, but word 16 + 4 i + b <- m of block b: group i of a set of 4 (Q4_1).
    comptime bb = block_bytes[qtype]()
    var idx = _header_perm[qtype]()
    for b in range(GROUP_BLOCKS):
        idx[LANES + GROUP_BLOCKS * i + b] = Int16(b * bb // 2 + 1)
    return idx


def _set_m_mask(i: Int) -> SIMD[DType.bool, 32]:
    # Words 16 + 4 i .. 16 + 4 i + 3: where group i of a set keeps its m.
    var mask = SIMD[DType.bool, 32](fill=False)
    for b in range(GROUP_BLOCKS):
        mask[LANES + GROUP_BLOCKS * i + b] = True
    return mask


def _word_bytes(words: SIMD[DType.int16, 32]) -> SIMD[DType.uint8, 64]:
    """The byte indices of a word permute: byte 2 i + j <- byte 2 words[i] + j."""
    var idx = SIMD[DType.uint8, 64](0)
    for i in range(64):
        idx[i] = UInt8(2 * Int(words[i // 2]) + i % 2)
    return idx


comptime _PACKED_PERM[qtype: StaticString] = _packed_perm[qtype]()
comptime _HEADER_PERM[qtype: StaticString] = _header_perm[qtype]()
comptime _SET_HEADER_PERM[qtype: StaticString, i: Int] = _set_header_perm[qtype, i]()
comptime _SET_M_MASK[i: Int] = _set_m_mask(i)


@always_inline
def _dot_halves(
    acc: SIMD[DType.int32, LANES], lo: SIMD[DType.uint8, 64], hi: SIMD[DType.uint8, 64], x_lo: SIMD[DType.int8, 64],
    x_hi: SIMD[DType.int8, 64],
) -> SIMD[DType.int32, LANES]:
    """acc[i] + the sum over bytes 4 i..4 i + 3 of lo x_lo + hi x_hi; lo, hi nibbles (<= 15), exact."""
    comptime if CompilationTarget.has_vnni():
        return dot_u8_i8_x2[15](dot_u8_i8_x2[15](acc, lo, x_lo), hi, x_hi)
    # AVX-512BW without VNNI: vpmaddubsw's int16 pair sums of both halves added as int16 (4 products,
    # at most 4 * 15 * 127 < 2^15: no saturation), then one vpmaddwd against ones.
    var pairs = llvm_intrinsic["llvm.x86.avx512.pmaddubs.w.512", SIMD[DType.int16, 32]](lo, x_lo) + llvm_intrinsic[
        "llvm.x86.avx512.pmaddubs.w.512", SIMD[DType.int16, 32]](hi, x_hi)
    var ones = SIMD[DType.int16, 32](1)
    return acc + llvm_intrinsic["llvm.x86.avx512.pmaddw.d.512", SIMD[DType.int32, LANES]](pairs, ones)


@always_inline
def _group_products[qtype: StaticString](
    blk: BytePtr, xg: Ptr[F32], xcg: Ptr[F32], far: Bool
) -> Tuple[SIMD[F32, LANES], SIMD[DType.int16, 32]]:
    """(t, window 0) of the group at `blk`: t[lane] = s x . q (Q4_0: x . (q - 8)) over the lane's 8
    values, which the lane's block scale d multiplies; window 0 (the group's first 64 bytes) holds
    its 4 headers."""
    comptime bb = block_bytes[qtype]()
    # A group spans 72-80 bytes: two lines ahead cover its stream.
    prefetch_ahead(blk, far)
    prefetch_ahead(blk.unsafe_offset(64), far)
    var win0 = bitcast[DType.int16, 32](blk.unsafe_load[width=64](0))
    var win1 = bitcast[DType.int16, 32](blk.unsafe_offset(4 * bb - 64).unsafe_load[width=64](0))
    var words: SIMD[DType.uint16, 32]
    comptime if byte_perm[qtype]():
        comptime idx = _word_bytes(_PACKED_PERM[qtype])
        words = bitcast[DType.uint16, 32](llvm_intrinsic["llvm.x86.avx512.vpermi2var.qi.512", SIMD[DType.uint8, 64]](
            bitcast[DType.uint8, 64](win0), opaque_indices[True](idx), bitcast[DType.uint8, 64](win1)))
    else:
        words = bitcast[DType.uint16, 32](
            llvm_intrinsic["llvm.x86.avx512.vpermi2var.hi.512", SIMD[DType.int16, 32]](win0, _PACKED_PERM[qtype], win1))
    # Byte i of the packed 64: low nibble = value i % 16 of block i // 16, high nibble value 16 + i % 16.
    var lo = bitcast[DType.uint8, 64](words & UInt16(0x0F0F))
    var hi = bitcast[DType.uint8, 64]((words >> UInt16(4)) & UInt16(0x0F0F))
    # Per lane (8 values) sum q (A 254^2 + B 254 + C), by Horner over the parts: at most
    # 8 * 15 * 127 * (254^2 + 254 + 1) < 2^30, exact in int32. Q4_0 then adds -8 sum (A 254^2 + B 254 + C):
    # the sum over q - 8, exact, with no cancellation in floats.
    var acc = SIMD[DType.int32, LANES](0)
    comptime for p in range(3):
        comptime if p > 0:
            acc = acc * Int32(PART_SCALE)
        acc = _dot_halves(acc, lo, hi, bitcast[DType.int8, 64](xg.unsafe_load[width=LANES](2 * p * LANES)),
                          bitcast[DType.int8, 64](xg.unsafe_load[width=LANES]((2 * p + 1) * LANES)))
    comptime if qtype == "q4_0":
        acc += bitcast[DType.int32, LANES](xcg.unsafe_load[width=LANES](LANES))
    return (acc.cast[F32]() * xcg.unsafe_load[width=LANES](0), win0)


@always_inline
def _permute_words[qtype: StaticString, perm: SIMD[DType.int16, 32]](window: SIMD[DType.int16, 32]) -> SIMD[DType.int16, 32]:
    """Word i of the result is window[perm[i] % 32]: vpermw, or a hidden vpermb where byte_perm."""
    comptime if byte_perm[qtype]():
        comptime idx = _word_bytes(perm)
        return bitcast[DType.int16, 32](permute_bytes[True](bitcast[DType.uint8, 64](window), idx))
    return llvm_intrinsic["llvm.x86.avx512.permvar.hi.512", SIMD[DType.int16, 32]](window, perm)


@always_inline
def _lone_group[qtype: StaticString](
    row: BytePtr, xp: Ptr[F32], xc: Ptr[F32], xs: Ptr[F32], g: Int, acc: SIMD[F32, LANES], acc_m: SIMD[F32, LANES],
    far: Bool,
) -> Tuple[SIMD[F32, LANES], SIMD[F32, LANES]]:
    """(acc, acc_m) plus group g's products, outside Q4_1's sets: its m term by itself."""
    comptime bb = block_bytes[qtype]()
    var r = _group_products[qtype](row.unsafe_offset(g * GROUP_BLOCKS * bb), xp.unsafe_offset(g * GROUP_X * LANES),
                                   xc.unsafe_offset(g * group_xc[qtype]() * LANES), far)
    var heads = bitcast[DType.float16, 32](_permute_words[qtype, _HEADER_PERM[qtype]](r[1]))
    var d_part = heads.slice[LANES, offset=0]().cast[F32]().fma(r[0], acc)
    comptime if qtype == "q4_1":
        return (d_part, heads.slice[LANES, offset=LANES]().cast[F32]().fma(xs.unsafe_load[width=LANES](g * LANES), acc_m))
    return (d_part, acc_m)


@always_inline
def qgemv_row_groups[qtype: StaticString](
    x: Ptr[F32], xp: Ptr[F32], xc: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32],
    n: Int, K: Int, far: Bool = False,
):
    """y[n] = x . dequant(W[n, :]) for one Q4 row; xp, xc, xs, xb from groups_layout of x.

    Args:
        x: [K] the activation row (for the blocks after the last whole group).
        xp: [groups, GROUP_X, 16], xc: [groups, group_xc, 16], xs: [groups, 16], xb: [K // 32] from
            groups_layout (xs and xb: Q4_1 only).
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
    var g = 0
    comptime if qtype == "q4_1":
        # Q4_1's m term by sets of 4 groups: each group's header permute also drops its 4 m into the
        # set's 16 words (merge-masked), and one conversion and one FMA with the 16 block sums of x
        # serve the set, instead of one of each per group.
        while g + SET_GROUPS <= groups:
            var m_words = SIMD[DType.int16, 32](0)
            comptime for i in range(SET_GROUPS):
                var gi = g + i
                var r = _group_products[qtype](row.unsafe_offset(gi * GROUP_BLOCKS * bb), xp.unsafe_offset(gi * GROUP_X * LANES),
                                               xc.unsafe_offset(gi * group_xc[qtype]() * LANES), far)
                var heads = _permute_words[qtype, _SET_HEADER_PERM[qtype, i]](r[1])
                acc = bitcast[DType.float16, 32](heads).slice[LANES, offset=0]().cast[F32]().fma(r[0], acc)
                m_words = _SET_M_MASK[i].select(heads, m_words)
            var m = bitcast[DType.float16, 32](m_words).slice[LANES, offset=LANES]().cast[F32]()
            acc_m = m.fma(xb.unsafe_load[width=LANES](g * GROUP_BLOCKS), acc_m)
            g += SET_GROUPS
    else:
        # Four groups per iteration, as Q4_1's sets (measured on the float nibble form: 1.14-1.18 ->
        # 1.08 ns per block).
        while g + SET_GROUPS <= groups:
            comptime for i in range(SET_GROUPS):
                acc = _lone_group[qtype](row, xp, xc, xs, g + i, acc, acc_m, far)[0]
            g += SET_GROUPS
    while g < groups:
        var r = _lone_group[qtype](row, xp, xc, xs, g, acc, acc_m, far)
        acc = r[0]
        acc_m = r[1]
        g += 1
    # Blocks after the last whole group.
    var tail = SIMD[F32, LANES](0)
    for b in range(groups * GROUP_BLOCKS, K // QBLOCK):
        var v = decode_block[qtype](row.unsafe_offset(b * bb))
        tail = v[1].fma(x.unsafe_load[width=LANES](b * QBLOCK + LANES), v[0].fma(x.unsafe_load[width=LANES](b * QBLOCK), tail))
    y[unsafe_offset=n] = (acc + acc_m + tail).reduce_add()
