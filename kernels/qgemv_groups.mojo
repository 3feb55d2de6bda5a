# Float-activation batch-1 Q4 rows of crucible.qmatmul on AVX-512 (act = "f32", M = 1, Q4_0 / Q4_1):
# y[n] = x . dequant(W[n, :]), a row read in groups of 4 blocks (128 values), no table lookups.
#
# Why: the block-at-a-time rows (qgemv_rows.mojo) turn each nibble into a float with a widening
# (vpmovzxbd) and a table permute (vpermps): three lane-crossing shuffles per block on Zen 4's two
# shuffle pipes, compute-bound at ~1.6 ns per block on one core. Here nibbles become floats by
# integer bit operations:
#   - one two-source word permute gathers the group's 4 x 16 packed bytes into 16 dword lanes (lanes
#     4b..4b+3: block b's bytes 4j..4j+3), and one more moves the 4 headers in front, 4 lanes each;
#   - nibble k of a lane (bits 4k..4k+3) is shifted to mantissa bits 19..22 and ORed with the exponent
#     of 1.0 (one vpternlogd with the mask): F = 1 + q / 16, exactly;
#   - x . q = sum 16 x F - sum 16 x. x is laid out once per call (groups_layout) in the lanes' order,
#     times 16, with the per-lane constant (and Q4_0's -8 x) in xc: per group t = xc + sum_k xp_k F_k
#     (8 FMAs), then acc += d t. Q4_1's m term: the m of 4 groups (16 blocks) are gathered by the
#     groups' own header permutes (merge-masked), then one conversion and one FMA with x's block sums.
#
# Accuracy: 16 x F is up to ~16 / |q - 8| times x (q - 8) and cancels against xc, so the partial sums
# round at a few times the table form's magnitude. Conformance grid, M = 1, largest ratio of the error
# to the fp32 dot bound (2 u sqrt(K) |x| . |w|) per shape: K = 576 0.008 -> 0.034 (Q4_0) and 0.021 ->
# 0.035 (Q4_1), K = 4096 0.002 -> 0.007; all shapes at most 0.045 (the table form: at most 0.10). One
# shift serving two nibbles (the second at bits 15..18, F = 1 + q / 256) was ~8% faster but reached
# 0.33: 256 x F cancels too much. Subtracting the 1 from that field instead cost as much as the shift.
#
# Measured: Zen 4, one core, cache-resident (benchmarks/profile_qmatmul.mojo "f32 group rows" against
# "f32 row kernel", 128 x 4096): Q4_0 1.59 -> 1.31 ns per block, Q4_1 1.59 -> 1.32 (with Q4_1's m term
# per group instead of per set, in the two-field form: 1.45 against 1.25). In a graph, chains of
# copies from DRAM, 6 interleaved rounds, medians per op, faster in every round: K = N = 4096 Q4_0
# 510.5 -> 446.5 us, Q4_1 525.5 -> 470.8; SmolLM2's Q4_1 K = 576, N = 1536 38.9 -> 35.8 and K = 1536,
# N = 576 36.9 -> 34.9.
# Blocks after the last whole group (K = 576: 2 of 18) take decode_block. Needs AVX-512BW (word
# permutes); other hosts keep qgemv_rows.

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
comptime ONE_BITS = UInt32(0x3F800000)      # float 1.0: the exponent every nibble float shares
comptime NIBBLE_FIELD = UInt32(0x00780000)  # mantissa bits 19..22: F = 1 + q / 16


def _value_index(lane: Int, k: Int) -> Int:
    """The value (0..127) of a group that nibble k of `lane` holds: lane 4b + j has block b's packed
    bytes 4j..4j+3, byte i holding value i (low nibble) and value i + 16 (high nibble)."""
    return (lane // 4) * QBLOCK + 4 * (lane % 4) + k // 2 + 16 * (k % 2)


def groups_layout[qtype: StaticString](x: Ptr[F32], K: Int, xp: Ptr[F32], xc: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32]):
    """Lays x out for qgemv_row_groups, once per call.

    Args:
        x: [K] the activation row.
        K: the row length; groups cover the first (K // 128) * 128 values.
        xp: [groups, 8, 16] out: 16 x in nibble order (k, lane).
        xc: [groups, 16] out: per lane -sum 16 x, minus 8 sum x for Q4_0.
        xs: [groups, 16] out: per lane sum x (Q4_1's m term, groups outside whole sets); Q4_1 only.
        xb: [K // 32] out: per block sum x (Q4_1's m term, sets of 4 groups); Q4_1 only.
    """
    comptime if qtype == "q4_1":
        block_sums(x, K // QBLOCK, xb)
    for g in range(K // GROUP_VALUES):
        for lane in range(LANES):
            var s = Float32(0)
            var c = Float32(0)
            for k in range(8):
                var v = x[unsafe_offset=g * GROUP_VALUES + _value_index(lane, k)]
                var scaled = 16.0 * v
                xp[unsafe_offset=(g * 8 + k) * LANES + lane] = scaled
                s += v
                c -= scaled
            comptime if qtype == "q4_1":
                xs[unsafe_offset=g * LANES + lane] = s
            else:
                c -= 8.0 * s
            xc[unsafe_offset=g * LANES + lane] = c


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
def _nibble_float[k: Int](packed: SIMD[DType.uint32, LANES]) -> SIMD[F32, LANES]:
    """1 + (nibble k of each lane) / 16: one shift to mantissa bits 19..22, one mask-and-OR."""
    comptime shift = 19 - 4 * k
    var v: SIMD[DType.uint32, LANES]
    comptime if shift >= 0:
        v = packed << UInt32(shift)
    else:
        v = packed >> UInt32(-shift)
    return bitcast[F32, LANES]((v & NIBBLE_FIELD) | ONE_BITS)


@always_inline
def _group_products[qtype: StaticString](
    blk: BytePtr, xg: Ptr[F32], xcg: Ptr[F32], far: Bool
) -> Tuple[SIMD[F32, LANES], SIMD[DType.int16, 32]]:
    """(t, window 0) of the group at `blk`: t[lane] = xc[lane] + sum_k xp[k, lane] F_k[lane], which the
    lane's block scale d multiplies; window 0 (the group's first 64 bytes) holds its 4 headers."""
    comptime bb = block_bytes[qtype]()
    # A group spans 72-80 bytes: two lines ahead cover its stream.
    prefetch_ahead(blk, far)
    prefetch_ahead(blk.unsafe_offset(64), far)
    var win0 = bitcast[DType.int16, 32](blk.unsafe_load[width=64](0))
    var win1 = bitcast[DType.int16, 32](blk.unsafe_offset(4 * bb - 64).unsafe_load[width=64](0))
    var packed = bitcast[DType.uint32, LANES](
        llvm_intrinsic["llvm.x86.avx512.vpermi2var.hi.512", SIMD[DType.int16, 32]](win0, _PACKED_PERM[qtype], win1))
    # Two chains, the first starting from the constant term: 8 FMAs, 1 add.
    var t0 = _nibble_float[0](packed).fma(xg.unsafe_load[width=LANES](0), xcg.unsafe_load[width=LANES](0))
    var t1 = _nibble_float[1](packed) * xg.unsafe_load[width=LANES](LANES)
    comptime for k in range(2, 8, 2):
        t0 = _nibble_float[k](packed).fma(xg.unsafe_load[width=LANES](k * LANES), t0)
        t1 = _nibble_float[k + 1](packed).fma(xg.unsafe_load[width=LANES]((k + 1) * LANES), t1)
    return (t0 + t1, win0)


@always_inline
def _permute_words(window: SIMD[DType.int16, 32], perm: SIMD[DType.int16, 32]) -> SIMD[DType.int16, 32]:
    """vpermw: word i of the result is window[perm[i] % 32]."""
    return llvm_intrinsic["llvm.x86.avx512.permvar.hi.512", SIMD[DType.int16, 32]](window, perm)


@always_inline
def qgemv_row_groups[qtype: StaticString](
    x: Ptr[F32], xp: Ptr[F32], xc: Ptr[F32], xs: Ptr[F32], xb: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32],
    n: Int, K: Int, far: Bool = False,
):
    """y[n] = x . dequant(W[n, :]) for one Q4 row; xp, xc, xs, xb from groups_layout of x.

    Args:
        x: [K] the activation row (for the blocks after the last whole group).
        xp: [groups, 8, 16], xc: [groups, 16], xs: [groups, 16], xb: [K // 32] from groups_layout
            (xs and xb: Q4_1 only).
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
                var r = _group_products[qtype](row.unsafe_offset(gi * GROUP_BLOCKS * bb), xp.unsafe_offset(gi * 8 * LANES),
                                               xc.unsafe_offset(gi * LANES), far)
                var heads = _permute_words(r[1], _SET_HEADER_PERM[qtype, i])
                acc = bitcast[DType.float16, 32](heads).slice[LANES, offset=0]().cast[F32]().fma(r[0], acc)
                m_words = _SET_M_MASK[i].select(heads, m_words)
            var m = bitcast[DType.float16, 32](m_words).slice[LANES, offset=LANES]().cast[F32]()
            acc_m = m.fma(xb.unsafe_load[width=LANES](g * GROUP_BLOCKS), acc_m)
            g += SET_GROUPS
    while g < groups:
        var r = _group_products[qtype](row.unsafe_offset(g * GROUP_BLOCKS * bb), xp.unsafe_offset(g * 8 * LANES),
                                       xc.unsafe_offset(g * LANES), far)
        var heads = bitcast[DType.float16, 32](_permute_words(r[1], _HEADER_PERM[qtype]))
        acc = heads.slice[LANES, offset=0]().cast[F32]().fma(r[0], acc)
        comptime if qtype == "q4_1":
            acc_m = heads.slice[LANES, offset=LANES]().cast[F32]().fma(xs.unsafe_load[width=LANES](g * LANES), acc_m)
        g += 1
    # Blocks after the last whole group.
    var tail = SIMD[F32, LANES](0)
    for b in range(groups * GROUP_BLOCKS, K // QBLOCK):
        var v = decode_block[qtype](row.unsafe_offset(b * bb))
        tail = v[1].fma(x.unsafe_load[width=LANES](b * QBLOCK + LANES), v[0].fma(x.unsafe_load[width=LANES](b * QBLOCK), tail))
    y[unsafe_offset=n] = (acc + acc_m + tail).reduce_add()
