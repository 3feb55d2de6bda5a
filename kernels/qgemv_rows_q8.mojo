# Int8-activation decode rows of crucible.qmatmul on CPU (act = "q8", M <= 32): x quantized to
# int8 per 32-value block (qdot_int8.mojo), integer block dot products. The dispatch over rows and
# cores is qmatmul_cpu.mojo's; the float-activation rows are qgemv_rows.mojo. One weight row in flight.
# Variants, by M and ISA:
#   - M = 1, Q4_0 / Q4_1: block pairs, two blocks per 512-bit dot product (x rearranged once per call),
#     GROUPS groups of 4 blocks in flight, one horizontal sum per row (qgemv_row_q8_pairs). Q4_0's -8
#     is folded into each dot product's start value (exact). Without 512-bit VNNI a pair's 256-bit
#     halves fold onto one 8-lane result and two pairs share one header conversion (_pair_group);
#     AVX2 without VNNI reduces whole octets of 8 blocks together (_octet). With AVX-512 VBMI + GFNI
#     a pair's nibbles and a group's headers come from byte permutes (qpair_bytes.NIBBLE_PERM).
#   - 3 to 8 rows: row pairs, two x rows per 512-bit dot product (qgemv_row_q8_mpairs).
#   - otherwise one block at a time (qgemv_rows_q8). Q8_0 on AVX2 without VNNI takes its signed bytes
#     as they are (qdot_int8.SIGNED_Q8).
# AVX2 without VNNI dots by vpmaddubsw pairs (qdot_int8.mojo), not a scalar emulation.

from std.memory import bitcast

from .common import BytePtr, F32, Ptr
from .qdot_int8 import (
    OCTETS, PAIR, PAIR_LANES, SIGNED_Q8, I8Ptr, dot_i8_i8, dot_u8_i8, dot_u8_i8_x2, dot_u8_i8_x2_fold, octet_dot,
    octet_floats, octet_nibbles, octet_scales,
)
from .qgemv_rows import prefetch_ahead, prefetch_stream
from .qpair_bytes import NIBBLE_PERM, group_headers, pair_nibbles
from .quant import HALF, QBLOCK, block_bytes, block_d, block_scales, header_bytes


def w_max_of[qtype: StaticString]() -> Int:
    """Largest weight byte the int8 path feeds dot_u8_i8: nibbles, 5-bit quants, or Q8_0's biased bytes."""
    comptime if qtype == "q8_0":
        return 255
    elif qtype == "q5_0" or qtype == "q5_1":
        return 31
    return 15


# Bit i of a Q5 block's qh is the fifth bit of value i: lane i of the 32 weights takes qh byte i // 8
# and tests bit i % 8 (byte ops only: one shuffle, an and, a min; 32-bit lanes took 4x the registers).
comptime QH_BIT = SIMD[DType.uint8, 32](
    1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128
)


@always_inline
def _int8_weights[qtype: StaticString](blk: BytePtr) -> SIMD[DType.uint8, 32]:
    """A block's 32 weights as _wdot takes them: nibbles, Q5's 5-bit quants (0..31), Q8_0's bytes + 128,
    or with SIGNED_Q8 Q8_0's bytes as they are."""
    comptime if qtype == "q8_0":
        comptime if SIGNED_Q8:
            return blk.unsafe_offset(2).unsafe_load[width=32](0)
        return blk.unsafe_offset(2).unsafe_load[width=32](0) ^ 0x80
    elif qtype == "q5_0" or qtype == "q5_1":
        # [f16 d (, f16 m)] [4 bytes qh] [16 bytes qs]: value j = nibble j | bit j of qh << 4 (quant.mojo).
        comptime qh_at = 4 if qtype == "q5_1" else 2
        var q = blk.unsafe_offset(qh_at + 4).unsafe_load[width=HALF](0)
        # qh's 4 bytes in every 4-byte lane (2-byte aligned in Q5_0's 22-byte blocks: an unaligned load).
        var qh4 = bitcast[DType.uint8, 32](SIMD[DType.uint32, 8](
            bitcast[DType.uint32, 1](blk.unsafe_offset(qh_at).unsafe_load[width=4](0))))
        var spread = qh4.shuffle[
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3
        ]()
        var fifth = min(spread & QH_BIT, SIMD[DType.uint8, 32](1)) << 4
        return (q & 0xF).join(q >> 4) | fifth
    else:
        comptime head = header_bytes[qtype]()
        var q = blk.unsafe_offset(head).unsafe_load[width=HALF](0)
        return (q & 0xF).join(q >> 4)


@always_inline
def _wdot[qtype: StaticString](acc: SIMD[DType.int32, 8], w: SIMD[DType.uint8, 32], x: SIMD[DType.int8, 32]) -> SIMD[DType.int32, 8]:
    """acc + the int32 lane sums of a block's weights (_int8_weights) times x bytes."""
    comptime if qtype == "q8_0" and SIGNED_Q8:
        return dot_i8_i8(acc, bitcast[DType.int8, 32](w), x)
    else:
        return dot_u8_i8[w_max_of[qtype]()](acc, w, x)


@always_inline
def _wdot_x2[qtype: StaticString](acc: SIMD[DType.int32, 16], w: SIMD[DType.uint8, 64], x: SIMD[DType.int8, 64]) -> SIMD[DType.int32, 16]:
    """_wdot over two blocks' worth of bytes (64 weights, 64 x bytes)."""
    comptime if qtype == "q8_0" and SIGNED_Q8:
        var lo = _wdot[qtype](acc.slice[8, offset=0](), w.slice[32, offset=0](), x.slice[32, offset=0]())
        var hi = _wdot[qtype](acc.slice[8, offset=8](), w.slice[32, offset=32](), x.slice[32, offset=32]())
        return lo.join(hi)
    else:
        return dot_u8_i8_x2[w_max_of[qtype]()](acc, w, x)


@always_inline
def _int8_scales[qtype: StaticString](blk: BytePtr) -> SIMD[F32, 2]:
    """(d, coef) of a block for the int8 path: value = d * wbyte + coef, so a block's dot product is
    d * dx * dot(wbytes, qx) + coef * sx. coef: Q4_1's m, Q4_0's -8d, Q8_0's -128d (the +128 bias) or
    0 (SIGNED_Q8); Q5_1's m and Q5_0's -16d likewise."""
    comptime if qtype == "q4_1" or qtype == "q5_1":
        return block_scales(blk)  # (d, m)
    elif qtype == "q4_0":
        return block_d[2](blk) * SIMD[F32, 2](1.0, -8.0)
    elif qtype == "q5_0":
        return block_d[2](blk) * SIMD[F32, 2](1.0, -16.0)
    elif SIGNED_Q8:
        return block_d[2](blk) * SIMD[F32, 2](1.0, 0.0)
    else:
        return block_d[2](blk) * SIMD[F32, 2](1.0, -128.0)


@always_inline
def _has_coef[qtype: StaticString]() -> Bool:
    """Whether the int8 path's offset term (coef * sx) is needed: coef is 0 for signed Q8_0 bytes."""
    return not (qtype == "q8_0" and SIGNED_Q8)


@always_inline
def qgemv_rows_q8[MROWS: Int, R: Int, qtype: StaticString](
    qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n0: Int, N: Int, K: Int,
    far: Bool = False,
):
    # y[m, n0:n0+R] for m < MROWS from int8 activations (qdot_int8.mojo): per block and row one integer
    # dot product per x row, scaled by d * dx; the offset term (Q4_1 m, Q4_0 -8d, Q8_0 -128d) times sx.
    comptime bb = block_bytes[qtype]()
    var nb = K // QBLOCK
    # U accumulator sets over consecutive blocks when few rows are in flight (see qgemv_rows.mojo).
    comptime U = 2 if MROWS * R <= 2 else 1
    var acc = Array[SIMD[F32, 8], U * MROWS * R](fill=SIMD[F32, 8](0))
    var offset = Array[Float32, U * MROWS * R](fill=0)
    var b0 = 0
    while b0 < nb:
        comptime for u in range(U):
            var b = b0 + u
            if b < nb:
                comptime for r in range(R):
                    var blk = w.unsafe_offset((n0 + r) * row_bytes + b * bb)
                    prefetch_ahead(blk, far)
                    var wq = _int8_weights[qtype](blk)
                    var dc = _int8_scales[qtype](blk)
                    var d = dc[0]
                    var coef = dc[1]
                    comptime for m in range(MROWS):
                        comptime i = (u * MROWS + m) * R + r
                        var xb = qx.unsafe_offset(m * K + b * QBLOCK).unsafe_load[width=32](0)
                        var dp = _wdot[qtype](SIMD[DType.int32, 8](0), wq, xb)
                        acc[i] = dp.cast[F32]().fma(SIMD[F32, 8](d * dx[unsafe_offset=m * nb + b]), acc[i])
                        comptime if _has_coef[qtype]():
                            offset[i] += coef * sx[unsafe_offset=m * nb + b]
        b0 += U
    comptime for m in range(MROWS):
        comptime for r in range(R):
            # One horizontal sum per output: the U sets are added as vectors first.
            var sum = acc[m * R + r]
            var total = offset[m * R + r]
            comptime for u in range(1, U):
                sum += acc[(u * MROWS + m) * R + r]
                total += offset[(u * MROWS + m) * R + r]
            y[unsafe_offset=m * N + n0 + r] = total + sum.reduce_add()


@always_inline
def qgemv_row_q8_mpairs[MROWS: Int, qtype: StaticString](
    qxp: I8Ptr, dxp: Ptr[F32], sxp: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n: Int, N: Int, K: Int,
    far: Bool = False,
):
    # y[m, n] for m < MROWS (3..8) from int8 activations, two x rows per 512-bit dot product: the
    # block's 32 weight bytes are repeated into both halves and dotted with x rows 2j and 2j+1
    # (row_pair_layout_q8), so one instruction, one conversion and one FMA serve two rows, and the
    # offset term is one FMA over all rows.
    comptime bb = block_bytes[qtype]()
    comptime MP = (MROWS + 1) // 2
    var nb = K // QBLOCK
    var row = w.unsafe_offset(n * row_bytes)
    var acc = Array[SIMD[F32, 16], MP](fill=SIMD[F32, 16](0))
    var off = SIMD[F32, 8](0)
    for b in range(nb):
        var blk = row.unsafe_offset(b * bb)
        prefetch_ahead(blk, far)
        var wq = _int8_weights[qtype](blk)
        var w2 = wq.join(wq)
        var dc = _int8_scales[qtype](blk)
        var d = dc[0]
        var coef = dc[1]
        comptime for j in range(MP):
            var xq = qxp.unsafe_offset((b * MP + j) * PAIR).unsafe_load[width=PAIR](0)
            var dp = _wdot_x2[qtype](SIMD[DType.int32, 16](0), w2, xq)
            acc[j] = dp.cast[F32]().fma(dxp.unsafe_load[width=16]((b * MP + j) * 16) * d, acc[j])
        comptime if _has_coef[qtype]():
            off = sxp.unsafe_load[width=8](b * 8).fma(SIMD[F32, 8](coef), off)
    comptime for j in range(MP):
        y[unsafe_offset=(2 * j) * N + n] = acc[j].slice[8, offset=0]().reduce_add() + off[2 * j]
        comptime if 2 * j + 1 < MROWS:
            y[unsafe_offset=(2 * j + 1) * N + n] = acc[j].slice[8, offset=8]().reduce_add() + off[2 * j + 1]


@always_inline
def _pair_scale[L: Int, a: Int, b: Int, W: Int](v: SIMD[F32, W]) -> SIMD[F32, L]:
    """[v[a] x4, v[b] x4], repeated to L lanes: the scale of each int32 lane of a pair's dot product."""
    var s8 = SIMD[F32, 4](v[a]).join(SIMD[F32, 4](v[b]))
    comptime if L == 16:
        return rebind[SIMD[F32, L]](s8.join(s8))
    else:
        return rebind[SIMD[F32, L]](s8)


@always_inline
def _pair_group[qtype: StaticString, NP: Int, FAR: Bool](
    blk: BytePtr, xq: I8Ptr, xs: Ptr[F32], dx: Ptr[F32], cx: Ptr[DType.int32],
    mut acc: Array[SIMD[F32, PAIR_LANES], NP], mut off: SIMD[F32, 4 * NP],
):
    # NP (1 or 2) consecutive block pairs of one weight row from `blk` on; xq, xs, cx point at the first
    # pair's x data and dx at its first block's scale (qdot_int8.mojo, block pairs). All 2 NP headers are
    # converted by one instruction and multiplied by x's scales in one more, so a pair's float work is
    # its lane scales (a broadcast of two values), one conversion and one FMA.
    comptime bb = block_bytes[qtype]()
    comptime L = PAIR_LANES
    comptime q4_1 = qtype == "q4_1"
    comptime per_block = 2 if q4_1 else 1  # lanes per block in prod
    prefetch_stream[FAR](blk)
    comptime if NP * 2 * bb > 64:
        prefetch_stream[FAR](blk.unsafe_offset(64))
    # prod: Q4_1 (d dx, m sx) per block; Q4_0 d dx per block. With NIBBLE_PERM the headers and the
    # first pair's nibbles come from one 64-byte window of the group (qpair_bytes.mojo).
    var prod: SIMD[F32, 2 * NP * per_block]
    var win0 = SIMD[DType.uint8, 64](0)
    comptime if NIBBLE_PERM and NP == 2:
        win0 = blk.unsafe_load[width=64](0)
    comptime if q4_1:
        var h = group_headers[qtype, NP, DType.uint32](blk, win0)
        var p4 = bitcast[DType.float16, 4 * NP](h).cast[F32]() * xs.unsafe_load[width=4 * NP](0)
        off += p4
        prod = rebind[SIMD[F32, 2 * NP * per_block]](p4)
    else:
        var h = group_headers[qtype, NP, DType.uint16](blk, win0)
        prod = rebind[SIMD[F32, 2 * NP * per_block]](
            bitcast[DType.float16, 2 * NP](h).cast[F32]() * dx.unsafe_load[width=2 * NP](0))
    var wq = pair_nibbles[qtype, NP](blk, win0)
    comptime for u in range(NP):
        var xv = xq.unsafe_offset(u * PAIR).unsafe_load[width=PAIR](0)
        var start = SIMD[DType.int32, L](0)
        comptime if not q4_1:
            start = cx.unsafe_load[width=L](u * L)
        var dp: SIMD[DType.int32, L]
        comptime if L == 16:
            dp = rebind[SIMD[DType.int32, L]](dot_u8_i8_x2[15](rebind[SIMD[DType.int32, 16]](start), wq[u], xv))
        else:
            dp = rebind[SIMD[DType.int32, L]](dot_u8_i8_x2_fold[15](rebind[SIMD[DType.int32, 8]](start), wq[u], xv))
        var scale = _pair_scale[L, 2 * u * per_block, (2 * u + 1) * per_block](prod)
        acc[u] = dp.cast[F32]().fma(scale, acc[u])


@always_inline
def _octet[qtype: StaticString, FAR: Bool](
    blk: BytePtr, xq: I8Ptr, xo: Ptr[F32], co: Ptr[DType.int32], mut acc: SIMD[F32, 8], mut moff: SIMD[F32, 8],
):
    # 8 consecutive blocks of one weight row from `blk` on (4 block pairs; qdot_int8.mojo, block octets);
    # xq points at the first pair's qx2 bytes, xo / co at the octet's x data. acc += the blocks'
    # d dx dot (Q4_0 with its -8 offset inside the dot), moff += Q4_1's m sx, lane k for block
    # octet_block(k).
    comptime bb = block_bytes[qtype]()
    comptime q4_1 = qtype == "q4_1"
    comptime head = header_bytes[qtype]()
    comptime for i in range(0, 8 * bb, 64):
        prefetch_stream[FAR](blk.unsafe_offset(i))
    var w_lo = Array[SIMD[DType.uint8, 32], 4](fill=SIMD[DType.uint8, 32](0))
    var w_hi = Array[SIMD[DType.uint8, 32], 4](fill=SIMD[DType.uint8, 32](0))
    octet_nibbles[qtype](blk, w_lo, w_hi)
    var dot = octet_dot(w_lo, w_hi, xq)
    var dm = octet_scales[qtype](blk)
    var d = dm[0]
    comptime if q4_1:
        moff = dm[1].fma(xo.unsafe_load[width=8](8), moff)
    else:
        dot += co.unsafe_load[width=8](0)
    acc = dot.cast[F32]().fma(d * xo.unsafe_load[width=8](0), acc)


@always_inline
def qgemv_row_q8_pairs[qtype: StaticString, FAR: Bool = False](
    qx2: I8Ptr, xs2: Ptr[F32], cx2: Ptr[DType.int32], xo: Ptr[F32], co: Ptr[DType.int32],
    qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n: Int, K: Int,
):
    # y[n] = x . dequant(W[n, :]) for one x row (Q4_0/Q4_1, act = "q8"), two blocks per dot product
    # (qdot_int8.mojo, block pairs). With OCTETS (AVX2 without VNNI) whole octets of 8 blocks go
    # first (_octet); then GROUPS groups of two pairs per step (_pair_group), then two pairs per
    # step; an odd last pair and an odd last block take the short paths. Q4_0's -8 offset starts
    # each dot product (cx2, co), Q4_1's m_b * sx_b is a float term per block (off's odd lanes, moff).
    comptime bb = block_bytes[qtype]()
    comptime head = header_bytes[qtype]()
    comptime L = PAIR_LANES
    var nb = K // QBLOCK
    var np = nb // 2
    var row = w.unsafe_offset(n * row_bytes)
    var acc = Array[SIMD[F32, L], 2](fill=SIMD[F32, L](0))
    var off = SIMD[F32, 8](0)
    var p = 0
    var total = Float32(0)
    comptime if OCTETS:
        comptime XO = octet_floats[qtype]()
        var acc8 = SIMD[F32, 8](0)
        var moff = SIMD[F32, 8](0)
        while p + 4 <= np:
            _octet[qtype, FAR](row.unsafe_offset(2 * p * bb), qx2.unsafe_offset(p * PAIR), xo.unsafe_offset((p // 4) * XO),
                          co.unsafe_offset((p // 4) * 8), acc8, moff)
            p += 4
        total = acc8.reduce_add() + moff.reduce_add()
    # GROUPS groups of 4 blocks per step, each into its own accumulators: with one group a step
    # waited on the previous step's FMAs into the same two accumulators. Two groups gave about half
    # the gain; 6 and 8 were slower at K = 576 (more blocks left to the short paths).
    comptime GROUPS = 4
    var accs = Array[SIMD[F32, L], 2 * GROUPS](fill=SIMD[F32, L](0))
    var offs = Array[SIMD[F32, 8], GROUPS](fill=SIMD[F32, 8](0))
    while p + 2 * GROUPS <= np:
        comptime for u in range(GROUPS):
            var pu = p + 2 * u
            var acc_u = Array[SIMD[F32, L], 2](fill=SIMD[F32, L](0))
            acc_u[0] = accs[2 * u]
            acc_u[1] = accs[2 * u + 1]
            var off_u = offs[u]
            _pair_group[qtype, 2, FAR](row.unsafe_offset(2 * pu * bb), qx2.unsafe_offset(pu * PAIR), xs2.unsafe_offset(4 * pu),
                                  dx.unsafe_offset(2 * pu), cx2.unsafe_offset(pu * L), acc_u, off_u)
            accs[2 * u] = acc_u[0]
            accs[2 * u + 1] = acc_u[1]
            offs[u] = off_u
        p += 2 * GROUPS
    while p + 2 <= np:
        _pair_group[qtype, 2, FAR](row.unsafe_offset(2 * p * bb), qx2.unsafe_offset(p * PAIR), xs2.unsafe_offset(4 * p),
                              dx.unsafe_offset(2 * p), cx2.unsafe_offset(p * L), acc, off)
        p += 2
    comptime for u in range(GROUPS):
        acc[0] += accs[2 * u]
        acc[1] += accs[2 * u + 1]
        off += offs[u]
    if p < np:
        # The odd last pair joins the row's accumulators, so a row ends in one horizontal sum.
        var acc1 = Array[SIMD[F32, L], 1](fill=SIMD[F32, L](0))
        var off1 = SIMD[F32, 4](0)
        _pair_group[qtype, 1, FAR](row.unsafe_offset(2 * p * bb), qx2.unsafe_offset(p * PAIR), xs2.unsafe_offset(4 * p),
                              dx.unsafe_offset(2 * p), cx2.unsafe_offset(p * L), acc1, off1)
        acc[0] += acc1[0]
        off += off1.join(SIMD[F32, 4](0))
    var sum = acc[0] + acc[1]
    comptime if qtype == "q4_1":
        # Q4_1's m sx terms sit in off's odd lanes; added before the one horizontal sum.
        var odd = off * SIMD[F32, 8](0, 1, 0, 1, 0, 1, 0, 1)
        comptime if L == 16:
            sum += rebind[SIMD[F32, L]](odd.join(SIMD[F32, 8](0)))
        else:
            sum += rebind[SIMD[F32, L]](odd)
    total += sum.reduce_add()
    if nb % 2 == 1:
        var b = nb - 1
        var blk = row.unsafe_offset(b * bb)
        var q = blk.unsafe_offset(head).unsafe_load[width=HALF](0)
        var dp = dot_u8_i8[15](SIMD[DType.int32, 8](0), (q & 0xF).join(q >> 4), qx.unsafe_offset(b * QBLOCK).unsafe_load[width=32](0))
        var dc = _int8_scales[qtype](blk)  # (d, coef): Q4_1's m or Q4_0's -8d
        total += dp.cast[F32]().reduce_add() * dc[0] * dx[unsafe_offset=b] + dc[1] * sx[unsafe_offset=b]
    y[unsafe_offset=n] = total
