# Int8-activation decode path of crucible.qmatmul (parameter act="q8"), the scheme llama.cpp runs on
# CPU: each x row is quantized per 32-value block to int8 with one float scale (Q8_0 style, round to
# nearest even), and every block dot product is an integer dot product of weight bytes and x bytes.
#
#   x block b of row m:  dx = max|x| / 127,  qx = round(x / dx),  sx = dx * sum(qx)
#   Q4_1 (q in 0..15):   sum_j w_j x_j  ~  d dx sum_j q_j qx_j + m sx
#   Q4_0 (q - 8):        d dx sum_j q_j qx_j - 8 d sx
#   Q8_0 (int8 q):       with VNNI read as q + 128 (xor 0x80), unsigned like the nibbles:
#                        d dx sum_j (q_j + 128) qx_j - 128 d sx; AVX2 without VNNI: signed (SIGNED_Q8)
# The integer sums are exact; the only approximation is qx (at most 0.5/127 of the block's max |x|).
# Why: a block is one u8 x s8 dot-product instruction (AVX512-VNNI vpdpbusd) plus one float FMA, not
# 32 conversions. AVX2 without VNNI uses llama.cpp's vpmaddubsw + vpmaddwd pair, exact only while a
# pair sum fits int16, so callers pass the largest weight byte (w_max: 15 for nibbles; Q8_0 takes
# dot_i8_i8 there). Other targets use a portable integer emulation. All paths give the same integers.

from std.sys import llvm_intrinsic
from std.sys.info import CompilationTarget

from std.memory import bitcast

from .common import BytePtr, F32, Ptr
from .quant import block_bytes, header_bytes

comptime I8Ptr = Pointer[Int8, MutAnyOrigin]


@always_inline
def _pairs_u8_i8(w: SIMD[DType.uint8, 32], x: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    # AVX2: sum_{j < 4} w[4i + j] * x[4i + j] via int16 pair sums; exact only for w <= 127 (see header).
    var p16 = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 16]](w, x)
    return llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, 8]](p16, SIMD[DType.int16, 16](1))


@always_inline
def dot_u8_i8[w_max: Int = 255](
    acc: SIMD[DType.int32, 8], w: SIMD[DType.uint8, 32], x: SIMD[DType.int8, 32]
) -> SIMD[DType.int32, 8]:
    """Returns acc[i] + sum_{j < 4} w[4i + j] * x[4i + j] (u8 x s8 products, exact in int32).

    w_max: the largest value w may hold; x must lie in [-127, 127] (quantize_rows_q8).
    """
    comptime if CompilationTarget.has_vnni():
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.256", SIMD[DType.int32, 8]](acc, w, x)
    elif CompilationTarget.has_avx2():
        # Larger bytes would saturate vpmaddubsw's int16 pair sums; Q8_0 goes through dot_i8_i8.
        comptime assert w_max <= 127, "dot_u8_i8 on AVX2 without VNNI needs w_max <= 127"
        return acc + _pairs_u8_i8(w, x)
    else:
        return _dot4_emulated(acc, w, x)


@always_inline
def _dot4_emulated[wtype: DType](
    acc: SIMD[DType.int32, 8], w: SIMD[wtype, 32], x: SIMD[DType.int8, 32]
) -> SIMD[DType.int32, 8]:
    # Portable form of the 4-byte lane dot products, for targets without AVX2.
    var p = w.cast[DType.int32]() * x.cast[DType.int32]()
    var out = acc
    comptime for i in range(8):
        out[i] += p[4 * i] + p[4 * i + 1] + p[4 * i + 2] + p[4 * i + 3]
    return out


# Q8_0 weights are signed bytes. With VNNI they are biased to unsigned (q + 128, vpdpbusd takes u8 x s8);
# with AVX2 and no VNNI they are dotted as they are, llama.cpp's sign trick: vpmaddubsw(|q|, x * sign(q))
# (vpabsb, vpsignb). Its pair sums are at most 2 * 128 * 127 < 2^15, so one vpmaddubsw + vpmaddwd per
# 32 bytes is exact, where biased bytes (up to 255) took two (a top-bit split, since removed) and a
# -128 d sx float term per block.
comptime SIGNED_Q8 = CompilationTarget.has_avx2() and not CompilationTarget.has_vnni()


@always_inline
def dot_i8_i8(acc: SIMD[DType.int32, 8], w: SIMD[DType.int8, 32], x: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    """Returns acc[i] + sum_{j < 4} w[4i + j] * x[4i + j] for signed w (any int8) and x in [-127, 127]."""
    comptime if CompilationTarget.has_avx2():
        var aw = bitcast[DType.uint8, 32](abs(w))  # |-128| wraps to the byte 128, its unsigned value
        var sx = llvm_intrinsic["llvm.x86.avx2.psign.b", SIMD[DType.int8, 32]](x, w)
        return acc + _pairs_u8_i8(aw, sx)
    else:
        return _dot4_emulated(acc, w, x)


def quantize_rows_q8(x: Ptr[F32], rows: Int, K: Int, qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32]):
    """Quantizes x [rows, K] float32 -> qx [rows, K] int8, dx [rows, K/32] scales, sx [rows, K/32] = dx * sum(qx)."""
    var nb = K // 32
    for m in range(rows):
        for b in range(nb):
            var v = x.unsafe_load[width=32](m * K + b * 32)
            var amax = abs(v).reduce_max()
            var d = amax / 127.0
            var inv = Float32(127.0) / amax if amax > 0 else Float32(0)
            var q = (v * inv).__round__().cast[DType.int8]()
            qx.unsafe_store(m * K + b * 32, q)
            dx[unsafe_offset=m * nb + b] = d
            sx[unsafe_offset=m * nb + b] = d * Float32(q.cast[DType.int32]().reduce_add())


# Block pairs for batch-1 decode of Q4_0/Q4_1 (qmatmul_cpu, act = "q8", M = 1): one 512-bit dot-product
# instruction covers two blocks. A pair's 32 weight bytes split into low nibbles [block b values 0..15,
# block b+1 values 0..15] and high nibbles [b 16..31, b+1 16..31]; x is stored once per call in that
# order, so the 64 weight bytes need no shuffle:
#   qx2[64 p ..]: x_b[0:16], x_b1[0:16], x_b[16:32], x_b1[16:32]      (int8)
#   xs2[4 p ..]:  Q4_1: dx_b, sx_b, dx_b1, sx_b1, times the headers d_b, m_b, d_b1, m_b1 as read
#                 (Q4_0 multiplies its d_b by dx directly)
#   cx2[L p ..]:  Q4_0: the int32 lanes' -8 * (sum of their qx2 bytes), the start value of the
#                 dot product: its -8 offset is then exact integer math inside the same instruction,
#                 with no float term per pair
# L = PAIR_LANES, the int32 lanes a pair's dot product ends in:
#   16 with AVX-512 VNNI: one vpdpbusd over all 64 bytes (4 bytes per lane); faster than one block per
#      256-bit instruction, in cache and streaming from DRAM.
#   8 elsewhere (dot_u8_i8_x2_fold): lane i adds the 4 bytes of lane i and of lane i + 8, which belong
#      to the same block, so one conversion, one scale multiply and one FMA serve the pair. With AVX2
#      (no VNNI) the two vpmaddubsw halves are added as int16 before one vpmaddwd (exact: 4 products of
#      at most 15 * 127 fit int16).
comptime PAIR = 64
comptime PAIR_LANES = 16 if CompilationTarget.has_vnni() and CompilationTarget.has_avx512f() else 8


@always_inline
def dot_u8_i8_x2[w_max: Int = 255](
    acc: SIMD[DType.int32, 16], w: SIMD[DType.uint8, 64], x: SIMD[DType.int8, 64]
) -> SIMD[DType.int32, 16]:
    """Returns acc[i] + sum_{j < 4} w[4i + j] * x[4i + j]: dot_u8_i8 over 64 bytes."""
    comptime if CompilationTarget.has_vnni() and CompilationTarget.has_avx512f():
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.512", SIMD[DType.int32, 16]](acc, w, x)
    else:
        var lo = dot_u8_i8[w_max](acc.slice[8, offset=0](), w.slice[32, offset=0](), x.slice[32, offset=0]())
        var hi = dot_u8_i8[w_max](acc.slice[8, offset=8](), w.slice[32, offset=32](), x.slice[32, offset=32]())
        return lo.join(hi)


@always_inline
def fold_u8_i8_x2_avx2(
    w_lo: SIMD[DType.uint8, 32], w_hi: SIMD[DType.uint8, 32], x_lo: SIMD[DType.int8, 32], x_hi: SIMD[DType.int8, 32]
) -> SIMD[DType.int16, 16]:
    """Int16 lane i = sum_{j < 2} (w_lo[2i + j] x_lo[2i + j] + w_hi[2i + j] x_hi[2i + j]): two vpmaddubsw
    added as int16. AVX2 only; exact when 4 * max|w| * 127 < 2^15 (the callers' bound: nibbles)."""
    return llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 16]](w_lo, x_lo) + llvm_intrinsic[
        "llvm.x86.avx2.pmadd.ub.sw", SIMD[DType.int16, 16]](w_hi, x_hi)


@always_inline
def dot_u8_i8_x2_fold[w_max: Int = 255](
    acc: SIMD[DType.int32, 8], w: SIMD[DType.uint8, 64], x: SIMD[DType.int8, 64]
) -> SIMD[DType.int32, 8]:
    """Returns acc[i] + sum_{j < 4} (w[4i + j] x[4i + j] + w[32 + 4i + j] x[32 + 4i + j]): dot_u8_i8_x2 with
    lane i + 8 folded onto lane i."""
    var w_lo = w.slice[32, offset=0]()
    var w_hi = w.slice[32, offset=32]()
    var x_lo = x.slice[32, offset=0]()
    var x_hi = x.slice[32, offset=32]()
    comptime if CompilationTarget.has_avx2() and not CompilationTarget.has_vnni() and w_max * 127 * 4 <= 32767:
        var p16 = fold_u8_i8_x2_avx2(w_lo, w_hi, x_lo, x_hi)
        return acc + llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, 8]](p16, SIMD[DType.int16, 16](1))
    else:
        return dot_u8_i8[w_max](dot_u8_i8[w_max](acc, w_lo, x_lo), w_hi, x_hi)


def pair_layout_q8[qtype: StaticString](
    qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], nb: Int, qx2: I8Ptr, xs2: Ptr[F32], cx2: Ptr[DType.int32],
    scales_from: Int = 0,
):
    """One quantized x row (quantize_rows_q8) -> the block-pair layout above, for nb // 2 pairs
    (xs2 is written for Q4_1, cx2 for Q4_0, both only from pair `scales_from` on: with OCTETS the
    pairs of whole octets read their scales from octet_layout_q8's arrays instead)."""
    for p in range(nb // 2):
        var b = 2 * p
        var xa = qx.unsafe_offset(b * 32).unsafe_load[width=32](0)
        var xb = qx.unsafe_offset(b * 32 + 32).unsafe_load[width=32](0)
        qx2.unsafe_offset(p * PAIR).unsafe_store(0, xa.slice[16, offset=0]().join(xb.slice[16, offset=0]()))
        qx2.unsafe_offset(p * PAIR + 32).unsafe_store(0, xa.slice[16, offset=16]().join(xb.slice[16, offset=16]()))
        if p < scales_from:
            continue
        comptime if qtype == "q4_1":
            xs2.unsafe_store(p * 4, SIMD[F32, 4](dx[unsafe_offset=b], sx[unsafe_offset=b],
                                                 dx[unsafe_offset=b + 1], sx[unsafe_offset=b + 1]))
        else:
            # Each int32 lane's sum of its 4 x bytes: the same dot product against weight bytes of 1.
            var xv = qx2.unsafe_offset(p * PAIR).unsafe_load[width=PAIR](0)
            comptime if PAIR_LANES == 16:
                cx2.unsafe_store(p * 16, dot_u8_i8_x2[1](SIMD[DType.int32, 16](0), SIMD[DType.uint8, PAIR](1), xv) * -8)
            else:
                cx2.unsafe_store(p * 8, dot_u8_i8_x2_fold[1](SIMD[DType.int32, 8](0), SIMD[DType.uint8, PAIR](1), xv) * -8)


# Block octets for batch-1 decode of Q4_0/Q4_1 on AVX2 without VNNI (OCTETS; qmatmul_cpu._octet): four
# block pairs of one weight row (8 blocks) reduced together. Each pair's folded int16 lanes hold 4
# products (|.| <= 4 * 15 * 127 = 7620), two vphaddw levels add them to 16 products per int16 lane
# (<= 30480 < 2^15, exact) and one vpmaddwd to one int32 per block, in lane order OCTET_BLOCK(k) =
# 0, 2, 4, 6, 1, 3, 5, 7 (vphaddw works within 128-bit halves). So 8 blocks take one conversion, one
# start add and one FMA with an 8-lane scale vector gathered in that order, where 4 pairs took 4 of
# each plus 8 shuffles to broadcast their scales. x's per-block data, in lane order, per octet o:
#   xo[XO o ..]:  dx (8 floats); Q4_1 then sx (8 floats): XO = 8 (Q4_0) or 16 (Q4_1)
#   co[8 o ..]:   Q4_0: -8 * sum(qx of the block), added to the int32 sums (the -8 offset, exact)
# qx2 (block pairs) holds the bytes; pairs past the last whole octet take the pair path.
comptime OCTETS = CompilationTarget.has_avx2() and not CompilationTarget.has_vnni()


@always_inline
def octet_block(k: Int) -> Int:
    """The block (0..7 within its octet) whose int32 sum lands in lane k of an octet's reduction."""
    return 2 * (k % 4) + k // 4


def octet_floats[qtype: StaticString]() -> Int:
    """XO: x floats per octet (dx; Q4_1 also sx)."""
    return 16 if qtype == "q4_1" else 8


def octet_layout_q8[qtype: StaticString](
    qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], nb: Int, xo: Ptr[F32], co: Ptr[DType.int32]
):
    """One quantized x row (quantize_rows_q8) -> the octet layout above for nb // 8 octets (co is written
    for Q4_0 only)."""
    comptime XO = octet_floats[qtype]()
    for o in range(nb // 8):
        for k in range(8):
            var b = 8 * o + octet_block(k)
            xo[unsafe_offset=XO * o + k] = dx[unsafe_offset=b]
            comptime if qtype == "q4_1":
                xo[unsafe_offset=XO * o + 8 + k] = sx[unsafe_offset=b]
            else:
                var xb = qx.unsafe_offset(b * 32).unsafe_load[width=32](0).cast[DType.int32]()
                co[unsafe_offset=8 * o + k] = -8 * xb.reduce_add()


@always_inline
def octet_nibbles[qtype: StaticString](
    blk: BytePtr, mut w_lo: Array[SIMD[DType.uint8, 32], 4], mut w_hi: Array[SIMD[DType.uint8, 32], 4]
):
    """The nibbles of the 8 Q4 blocks from `blk` on as octet_dot takes them: pair u = blocks 2u, 2u + 1,
    w_lo[u] = [2u's low nibbles (values 0..15), 2u + 1's], w_hi[u] the high ones (values 16..31)."""
    comptime bb = block_bytes[qtype]()
    comptime head = header_bytes[qtype]()
    comptime for u in range(4):
        var q = blk.unsafe_offset(2 * u * bb + head).unsafe_load[width=16](0).join(
            blk.unsafe_offset((2 * u + 1) * bb + head).unsafe_load[width=16](0))
        w_lo[u] = q & 0xF
        w_hi[u] = q >> 4


@always_inline
def octet_scales[qtype: StaticString](blk: BytePtr) -> Tuple[SIMD[F32, 8], SIMD[F32, 8]]:
    """(d, m) of the 8 Q4 blocks from `blk` on, lane k for block octet_block(k); m is zero for Q4_0."""
    comptime bb = block_bytes[qtype]()
    comptime if qtype == "q4_1":
        # Headers (d, m) as two halves per block, gathered in lane order and split into d and m.
        var h = SIMD[DType.uint32, 8](0)
        comptime for k in range(8):
            h[k] = blk.unsafe_offset(octet_block(k) * bb).unsafe_bitcast[UInt32]()[unsafe_offset=0]
        var dm = bitcast[DType.float16, 16](h).deinterleave()
        return (dm[0].cast[F32](), dm[1].cast[F32]())
    else:
        var h = SIMD[DType.uint16, 8](0)
        comptime for k in range(8):
            h[k] = blk.unsafe_offset(octet_block(k) * bb).unsafe_bitcast[UInt16]()[unsafe_offset=0]
        return (bitcast[DType.float16, 8](h).cast[F32](), SIMD[F32, 8](0))


@always_inline
def octet_dot[mult: Int = 1](
    w_lo: Array[SIMD[DType.uint8, 32], 4], w_hi: Array[SIMD[DType.uint8, 32], 4], x: I8Ptr
) -> SIMD[DType.int32, 8]:
    """The int32 dot products of 8 nibble blocks (octet_nibbles) with their qx2 bytes from x on, times
    `mult` (free: the last vpmaddwd's factor; |mult| * 30480 * 2 must fit int32), lane k holding
    block octet_block(k). AVX2 only."""
    var p16 = Array[SIMD[DType.int16, 16], 4](fill=SIMD[DType.int16, 16](0))
    comptime for u in range(4):
        var xv = x.unsafe_offset(u * PAIR).unsafe_load[width=PAIR](0)
        p16[u] = fold_u8_i8_x2_avx2(w_lo[u], w_hi[u], xv.slice[32, offset=0](), xv.slice[32, offset=32]())
    var h01 = llvm_intrinsic["llvm.x86.avx2.phadd.w", SIMD[DType.int16, 16]](p16[0], p16[1])
    var h23 = llvm_intrinsic["llvm.x86.avx2.phadd.w", SIMD[DType.int16, 16]](p16[2], p16[3])
    var h = llvm_intrinsic["llvm.x86.avx2.phadd.w", SIMD[DType.int16, 16]](h01, h23)
    return llvm_intrinsic["llvm.x86.avx2.pmadd.wd", SIMD[DType.int32, 8]](h, SIMD[DType.int16, 16](mult))


def row_pair_layout_q8(
    qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], rows: Int, nb: Int, qxp: I8Ptr, dxp: Ptr[F32], sxp: Ptr[F32]
):
    """Quantized x rows (quantize_rows_q8, rows <= 8; decode passes 3 to 8) -> the row-pair layout:
    qxp[(b * MP + j) * 64 ..] = qx[2j, block b], qx[2j+1, block b]; dxp likewise with each row's scale
    repeated over its 8 int32 lanes; sxp[b * 8 + m] = sx[m, b]. MP = ceil(rows / 2); a missing odd
    row is zeros (its lanes add nothing)."""
    var mp = (rows + 1) // 2
    var K = nb * 32
    for b in range(nb):
        for j in range(mp):
            var base = (b * mp + j)
            for h in range(2):
                var m = 2 * j + h
                if m < rows:
                    qxp.unsafe_offset(base * PAIR + 32 * h).unsafe_store(0, qx.unsafe_offset(m * K + b * 32).unsafe_load[width=32](0))
                    dxp.unsafe_store(base * 16 + 8 * h, SIMD[F32, 8](dx[unsafe_offset=m * nb + b]))
                else:
                    qxp.unsafe_offset(base * PAIR + 32 * h).unsafe_store(0, SIMD[DType.int8, 32](0))
                    dxp.unsafe_store(base * 16 + 8 * h, SIMD[F32, 8](0))
        for m in range(8):
            sxp[unsafe_offset=b * 8 + m] = sx[unsafe_offset=m * nb + b] if m < rows else Float32(0)
