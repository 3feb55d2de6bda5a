# In-register shuffles of W x W float tiles, for any power-of-two vector width W: the transpose the
# GEMM packs weight panels with, and the horizontal-sum tree decode attention reduces its dot products
# with. W is the target's float32 SIMD width (FW): 16 with AVX-512, 8 with AVX2, 4 with SSE or NEON.
#
# Both are log2(W) stages of two-source shuffles whose masks are computed at compile time from W and
# the stage, so one body serves every width. They replace hand-written 16- and 8-lane copies whose
# masks were the same arithmetic (and which left 4-lane targets, aarch64 and baseline x86-64, unable
# to compile the kernels). The masks are compile-time constants, so LLVM lowers each shuffle as
# before (vpermt2ps / vshufps / vpermilps / zip on NEON).

from std.utils.index import IndexList

from .common import F32


def _log2[W: Int]() -> Int:
    var s = 0
    while (1 << s) < W:
        s += 1
    return s


def _swap_mask[W: Int, b: Int, upper: Bool]() -> IndexList[W]:
    # Mask over (r0 ++ r1), 2W lanes: lane l of the result lies in block l // b of b lanes.
    # lower (row i):     even blocks keep r0's lanes, odd blocks take r1's block one to the left.
    # upper (row i + b): even blocks take r0's block one to the right, odd blocks keep r1's lanes.
    var m = IndexList[W]()
    for l in range(W):
        var even = (l // b) % 2 == 0
        comptime if upper:
            m[l] = l + b if even else W + l
        else:
            m[l] = l if even else W + l - b
    return m


@always_inline
def _swap_blocks[W: Int, b: Int](mut t: Array[SIMD[F32, W], W]):
    # One transpose stage: rows i and i + b exchange their off-diagonal b x b blocks.
    comptime lower = _swap_mask[W, b, False]()
    comptime upper = _swap_mask[W, b, True]()
    comptime for i in range(W):
        comptime if (i // b) % 2 == 0:
            var r0 = t[i]
            var r1 = t[i + b]
            t[i] = r0.shuffle[lower](r1)
            t[i + b] = r0.shuffle[upper](r1)


@always_inline
def transpose_tile[W: Int](mut t: Array[SIMD[F32, W], W]):
    """In-register W x W float transpose: t[i][j] becomes t[j][i].

    log2(W) stages (b = W/2, ..., 1) of W two-source shuffles each.
    """
    comptime assert W >= 2 and (W & (W - 1)) == 0, "tile width must be a power of two"
    comptime for s in range(_log2[W]()):
        _swap_blocks[W, W >> (s + 1)](t)


def _fold_mask[W: Int, h: Int, upper: Bool]() -> IndexList[W]:
    # Mask over (x ++ y), 2W lanes. x and y each hold W / (2h) groups of 2h partial sums; result lane
    # l takes x's groups for l < W/2 and y's after, each group cut to its first (lower) or second
    # (upper) h lanes. Adding the two results folds every group of 2h to h.
    var m = IndexList[W]()
    for l in range(W):
        var src = 0 if l < W // 2 else W
        var li = l % (W // 2)
        m[l] = src + (li // h) * 2 * h + li % h + (h if upper else 0)
    return m


@always_inline
def _fold[W: Int, h: Int](x: SIMD[F32, W], y: SIMD[F32, W]) -> SIMD[F32, W]:
    # One stage of the sum tree: two shuffles and one add.
    comptime lower = _fold_mask[W, h, False]()
    comptime upper = _fold_mask[W, h, True]()
    return x.shuffle[lower](y) + x.shuffle[upper](y)


@always_inline
def sum_lanes_tile[W: Int](var acc: Array[SIMD[F32, W], W]) -> SIMD[F32, W]:
    """Lane i = the sum of acc[i]'s W lanes: W - 1 fold stages instead of W separate reductions.

    Stage h = W/2, ..., 1 pairs up the live vectors and halves their count.
    """
    comptime assert W >= 2 and (W & (W - 1)) == 0, "tile width must be a power of two"
    comptime for s in range(_log2[W]()):
        comptime h = W >> (s + 1)
        comptime for i in range(h):
            acc[i] = _fold[W, h](acc[2 * i], acc[2 * i + 1])
    return acc[0]
