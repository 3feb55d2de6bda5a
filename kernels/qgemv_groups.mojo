# Float-activation batch-1 Q4 rows of crucible.qmatmul on AVX-512BW (act = "f32", M = 1, Q4_0 / Q4_1):
# y[n] = x . dequant(W[n, :]), a row read in groups of 4 blocks (128 values), in integers.
#
# Why: the block-at-a-time rows (qgemv_rows.mojo) turn each nibble into a float with a widening
# (vpmovzxbd) and a table permute (vpermps): three lane-crossing shuffles per block on Zen 4's two
# shuffle pipes, compute-bound at ~1.6 ns per block on one core. Here:
#   - x is laid out once per call (groups_layout): per block of 32 values, s = max|x| / 32767 and two
#     int16 parts, x = s (H + L / 2^15) to about one fp32 rounding of x / s (|H| <= 32767,
#     |L| <= 16384), in the order the nibbles come out below;
#   - one two-source word permute gathers a group's 4 x 16 packed bytes into 32 words (words 8b..8b+7:
#     block b), one more moves the 4 headers in front, 4 lanes each;
#   - nibble k of every word is one shift and/or one mask (6 ops for 4 nibbles), and vpdpwssd (VNNI;
#     vpmaddwd and an add without it) sums nibble x H and nibble x L per pair of words into int32,
#     exactly: per lane (8 values) under 2^22. Q4_0 starts those sums from -8 sum H and -8 sum L, so
#     they are sums of H (q - 8) with no cancellation. Then t = (sh + sl / 2^15) s per lane, and
#     acc += d t. Q4_1's m term: the m of 4 groups (16 blocks) are gathered by the groups' own header
#     permutes (merge-masked), then one conversion and one FMA with x's block sums.
#
# Accuracy (conformance grid, M = 1, largest ratio of the error to the fp32 dot bound
# 2 u sqrt(K) |x| . |w|): K = 576 Q4_0 0.007, Q4_1 0.018; K = 4096 0.002 / 0.004. The float nibble form
# this replaced (16 x F - 16 x with F = 1 + q / 16, in FMAs) reached 0.035 / 0.035 and 0.007, and with
# x mixing 1e4 and 1e-3 in a block (the grid's special-x case) its cancellation reached 7.7 times that
# bound for Q4_0 (0.12 against the split bound |d q| + |offset| the case uses; here 0.08). A block
# whose max|x| is under 1e-30 counts as zero; an inf or NaN in x makes its s NaN, so y is NaN as in
# fp32.
# Also tried: nibbles as bf16 (1 + q / 16 in bits 3..6) with vdpbf16ps and x in two bf16 parts: Zen 4
# 1.07 / 1.13 ns per block, but x holds only ~17 bits that way (grid ratio 0.76 at K = 160); in three
# bf16 parts (24 bits) 1.35, slower than the float form.
#
# Measured against the float nibble form, Zen 4: one core, cache-resident (benchmarks/profile_qmatmul.mojo
# "f32 group rows", 128 x 4096, 4 alternating runs on a noisy host): Q4_0 1.30-1.43 -> 1.15-1.31, Q4_1
# 1.36-1.45 -> 1.09-1.10 ns per block. In a graph, chains of copies from DRAM, 8 interleaved rounds, medians per
# op: K = N = 4096 Q4_0 547.1 -> 507.5 us, Q4_1 471.1 -> 427.7 (faster in 8 of 8 rounds each);
# SmolLM2's Q4_1 K = 576, N = 1536 35.9 -> 32.4 (8 of 8) and K = 1536, N = 576 47.9 -> 43.0 (7 of 8).
# Blocks after the last whole group (K = 576: 2 of 18) take decode_block. Needs AVX-512BW (word
# permutes and shifts); other hosts keep qgemv_rows.

from std.memory import bitcast
from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget

from .common import BytePtr, F32, Ptr
from .qgemv_rows import block_sums, prefetch_ahead
from .quant import QBLOCK, block_bytes, decode_block, header_bytes

comptime GROUPS_F32 = CompilationTarget.has_avx512f() and CompilationTarget._has_feature["avx512bw"]()
comptime GROUP_BLOCKS = 4
comptime GROUP_VALUES = GROUP_BLOCKS * QBLOCK
comptime SET_GROUPS = 4     # Q4_1: groups whose 16 m share one conversion (LANES / GROUP_BLOCKS)
comptime LANES = 16
comptime GROUP_X = 8       # vectors of 16 floats' bits per group in groups_layout's xp: H and L, 4 nibbles
comptime GROUP_XC = 3      # ... in its xc: Q4_0's -8 sum H and -8 sum L (int32), and s
comptime H_MAX = 32767.0   # |H| <= H_MAX: int16
comptime L_SCALE = 32768.0  # L = the rest of x / s below H's rounding, times 2^15


def groups_layout[qtype: StaticString](x: Ptr[F32], K: Int, xp: Ptr[F32], xc: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32]):
    """Lays x out for qgemv_row_groups, once per call.

    Per block of 32 values: s = max|x| / 32767, u = x / s, H = round(u), L = round((u - H) 2^15).
    Word w of a group's nibble vector k holds block w // 8's value 2 (w % 8) + 16 (k % 2) + k // 2:
    for nibble k, the even (k < 2) or odd values of the block's low (k even) or high half. Lane i
    (of 16 int32 sums) covers words 2 i and 2 i + 1 of every k: 8 values of block i // 4.

    Args:
        x: [K] the activation row.
        K: the row length; groups cover the first (K // 128) * 128 values.
        xp: [groups, 2, 4, 32] int16 out (in [groups, GROUP_X, 16] floats' bits): H, then L, by nibble k.
        xc: [groups, GROUP_XC, 16] out: Q4_0's per lane -8 sum H and -8 sum L (int32 bits), then s.
        xs: [groups, 16] out: per lane sum x (Q4_1's m term, groups outside whole sets); Q4_1 only.
        xb: [K // 32] out: per block sum x (Q4_1's m term, sets of 4 groups); Q4_1 only.
    """
    comptime if qtype == "q4_1":
        block_sums(x, K // QBLOCK, xb)
    for g in range(K // GROUP_VALUES):
        var gx = x.unsafe_offset(g * GROUP_VALUES)
        var scale = SIMD[F32, LANES](0)
        var inv = SIMD[F32, GROUP_BLOCKS](0)
        comptime for b in range(GROUP_BLOCKS):
            var lo = gx.unsafe_load[width=16](b * QBLOCK)
            var hi = gx.unsafe_load[width=16](b * QBLOCK + 16)
            var amax = max(abs(lo).reduce_max(), abs(hi).reduce_max())
            # A block whose largest |x| is under 1e-30 counts as zero (1 / s could overflow): an
            # absolute error under 32e-30 max|w|. An inf or NaN in x makes s NaN, so y is NaN as in
            # fp32 (x * 0 is NaN exactly for them; max() alone could drop a NaN).
            inv[b] = H_MAX / amax if amax > 1e-30 else Float32(0)
            var poison = (lo * 0.0 + hi * 0.0).reduce_add()
            comptime for j in range(4):
                scale[4 * b + j] = amax / H_MAX + poison
        var sum_h = SIMD[DType.int32, LANES](0)
        var sum_l = SIMD[DType.int32, LANES](0)
        var sum_x = SIMD[F32, LANES](0)
        comptime for k in range(4):
            var h32 = SIMD[F32, 32](0)
            var l32 = SIMD[F32, 32](0)
            var x32 = SIMD[F32, 32](0)
            comptime for b in range(GROUP_BLOCKS):
                var v = gx.unsafe_load[width=16](b * QBLOCK + 16 * (k % 2)).deinterleave()[k // 2]
                var u = v * inv[b]
                var h = u.__round__()
                h32 = h32.insert[offset=8 * b](h)
                l32 = l32.insert[offset=8 * b](((u - h) * L_SCALE).__round__())
                x32 = x32.insert[offset=8 * b](v)
            xp.unsafe_store((g * GROUP_X + k) * LANES, bitcast[F32, LANES](h32.cast[DType.int16]()))
            xp.unsafe_store((g * GROUP_X + 4 + k) * LANES, bitcast[F32, LANES](l32.cast[DType.int16]()))
            # Words 2 i and 2 i + 1 to lane i.
            var hp = h32.cast[DType.int32]().deinterleave()
            var lp = l32.cast[DType.int32]().deinterleave()
            var xv = x32.deinterleave()
            sum_h += hp[0] + hp[1]
            sum_l += lp[0] + lp[1]
            sum_x += xv[0] + xv[1]
        comptime if qtype == "q4_1":
            xs.unsafe_store(g * LANES, sum_x)
        else:
            xc.unsafe_store(g * GROUP_XC * LANES, bitcast[F32, LANES](-8 * sum_h))
            xc.unsafe_store((g * GROUP_XC + 1) * LANES, bitcast[F32, LANES](-8 * sum_l))
        xc.unsafe_store((g * GROUP_XC + 2) * LANES, scale)


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


comptime _PACKED_PERM[qtype: StaticString] = _packed_perm[qtype]()
comptime _HEADER_PERM[qtype: StaticString] = _header_perm[qtype]()
comptime _SET_HEADER_PERM[qtype: StaticString, i: Int] = _set_header_perm[qtype, i]()
comptime _SET_M_MASK[i: Int] = _set_m_mask(i)


@always_inline
def _nibble_i16[k: Int](words: SIMD[DType.uint16, 32]) -> SIMD[DType.int32, LANES]:
    """Nibble k (bits 4k..4k+3) of each 16-bit word, as an int16 word; 1 or 2 ops."""
    var v: SIMD[DType.uint16, 32]
    comptime if k == 0:
        v = words & UInt16(0xF)
    elif k == 3:
        v = words >> UInt16(12)
    else:
        v = (words >> UInt16(4 * k)) & UInt16(0xF)
    return bitcast[DType.int32, LANES](v)


@always_inline
def _dot_i16(acc: SIMD[DType.int32, LANES], a: SIMD[DType.int32, LANES], b: SIMD[DType.int32, LANES]) -> SIMD[DType.int32, LANES]:
    """acc[i] + a.word[2 i] b.word[2 i] + a.word[2 i + 1] b.word[2 i + 1], exact in int32."""
    comptime if CompilationTarget.has_vnni():
        return llvm_intrinsic["llvm.x86.avx512.vpdpwssd.512", SIMD[DType.int32, LANES]](
            acc, bitcast[DType.int16, 32](a), bitcast[DType.int16, 32](b))
    # AVX-512BW without VNNI: vpmaddwd, then an add. On Zen 4 (forcing this branch), one core,
    # cache-resident, 128 x 4096: Q4_0 1.15-1.33, Q4_1 1.07-1.27 ns per block against vpdpwssd's
    # 1.07-1.31 / 1.09-1.17 and the float nibble form's 1.43-1.46 / 1.33-1.45 (3 alternating runs).
    return acc + llvm_intrinsic["llvm.x86.avx512.pmaddw.d.512", SIMD[DType.int32, LANES]](
        bitcast[DType.int16, 32](a), bitcast[DType.int16, 32](b))


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
    var words = llvm_intrinsic["llvm.x86.avx512.vpermi2var.hi.512", SIMD[DType.int16, 32]](win0, _PACKED_PERM[qtype], win1)
    # Per lane (8 values): sh = sum q H, sl = sum q L, under 2^22: exact in int32 and in fp32. Q4_0
    # starts them from -8 sum H and -8 sum L: sums of H (q - 8), with no cancellation in floats.
    var w16 = bitcast[DType.uint16, 32](words)
    var sh = SIMD[DType.int32, LANES](0)
    var sl = SIMD[DType.int32, LANES](0)
    comptime if qtype == "q4_0":
        sh = bitcast[DType.int32, LANES](xcg.unsafe_load[width=LANES](0))
        sl = bitcast[DType.int32, LANES](xcg.unsafe_load[width=LANES](LANES))
    comptime for k in range(4):
        var q = _nibble_i16[k](w16)
        sh = _dot_i16(sh, q, bitcast[DType.int32, LANES](xg.unsafe_load[width=LANES](k * LANES)))
        sl = _dot_i16(sl, q, bitcast[DType.int32, LANES](xg.unsafe_load[width=LANES]((4 + k) * LANES)))
    var t = sl.cast[F32]().fma(1.0 / L_SCALE, sh.cast[F32]())
    return (t * xcg.unsafe_load[width=LANES](2 * LANES), win0)


@always_inline
def _permute_words(window: SIMD[DType.int16, 32], perm: SIMD[DType.int16, 32]) -> SIMD[DType.int16, 32]:
    """vpermw: word i of the result is window[perm[i] % 32]."""
    return llvm_intrinsic["llvm.x86.avx512.permvar.hi.512", SIMD[DType.int16, 32]](window, perm)


@always_inline
def _lone_group[qtype: StaticString](
    row: BytePtr, xp: Ptr[F32], xc: Ptr[F32], xs: Ptr[F32], g: Int, acc: SIMD[F32, LANES], acc_m: SIMD[F32, LANES],
    far: Bool,
) -> Tuple[SIMD[F32, LANES], SIMD[F32, LANES]]:
    """(acc, acc_m) plus group g's products, outside Q4_1's sets: its m term by itself."""
    comptime bb = block_bytes[qtype]()
    var r = _group_products[qtype](row.unsafe_offset(g * GROUP_BLOCKS * bb), xp.unsafe_offset(g * GROUP_X * LANES),
                                   xc.unsafe_offset(g * GROUP_XC * LANES), far)
    var heads = bitcast[DType.float16, 32](_permute_words(r[1], _HEADER_PERM[qtype]))
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
        xp: [groups, GROUP_X, 16], xc: [groups, GROUP_XC, 16], xs: [groups, 16], xb: [K // 32] from
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
                                               xc.unsafe_offset(gi * GROUP_XC * LANES), far)
                var heads = _permute_words(r[1], _SET_HEADER_PERM[qtype, i])
                acc = bitcast[DType.float16, 32](heads).slice[LANES, offset=0]().cast[F32]().fma(r[0], acc)
                m_words = _SET_M_MASK[i].select(heads, m_words)
            var m = bitcast[DType.float16, 32](m_words).slice[LANES, offset=LANES]().cast[F32]()
            acc_m = m.fma(xb.unsafe_load[width=LANES](g * GROUP_BLOCKS), acc_m)
            g += SET_GROUPS
    else:
        # Four groups per iteration, as Q4_1's sets: Q4_0 1.14-1.18 -> 1.08 ns per block (one core,
        # cache-resident, 128 x 4096, best of 3 alternating runs, measured with the constant term
        # added in floats).
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
