# Float-activation decode rows of crucible.qmatmul on CPU (act = "f32", M <= 32): y[m, n] =
# x[m, :] . dequant(W[n, :]) with each GGUF block decoded in registers, never to memory. The
# dispatch over rows and cores is qmatmul_cpu.mojo's; the int8-activation rows are qgemv_rows_q8.mojo.
# Batch-1 Q4_0 / Q4_1 rows take qgemv_groups.mojo instead on AVX-512BW hosts and qgemv_octets.mojo on
# AVX2 hosts without VNNI (x in int8 parts, no per-nibble conversions).

from std.memory import bitcast
from std.sys import PrefetchOptions, prefetch
from std.sys.info import CompilationTarget

from .common import BytePtr, F32, Ptr
from .cpu_tuning import FAR_PREFETCH, FAR_PREFETCH_PAIRS
from .quant import HALF, QBLOCK, block_bytes, block_d, block_scales, chunk_offset, decode_chunk, dot_chunk, five_bit_values, header_bytes, nibble_values
from .quant_iq import iq4_nibbles


comptime LANES = SIMD[DType.uint32, HALF](0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)

# Software prefetch distance along a weight row stream. 4 KB rather than 1 KB: at DRAM rates a 1 KB
# lead is well under the memory latency (2 KB and 8 KB measured between or mixed).
comptime PREFETCH_BYTES = 4096
# Where cpu_tuning.FAR_PREFETCH holds, tasks of at least FAR_MIN_TASK_BYTES prefetch at two distances
# instead, FAR_L1_BYTES ahead into L1 and FAR_L2_BYTES ahead into L2 only (prefetcht1): more lines in
# flight than L1's miss buffers hold. Large ops gain, small ones lose, so the dispatch chooses per task
# (far_prefetch). cpu_tuning.FAR_PREFETCH_PAIRS allows it for the batch-1 int8 pair rows of Q4_0 and
# Q4_1 (act = "q8", M = 1; far_allowed[pairs=True], given by qmatmul_cpu._q8_pairs) alone.
comptime FAR_MIN_TASK_BYTES = 1 << 20
comptime FAR_L1_BYTES = 1024   # distance of the prefetch into L1
comptime FAR_L2_BYTES = 8192   # distance of the prefetch into L2


def far_allowed[pairs: Bool = False]() -> Bool:
    """Whether this host's decode rows may take the two-distance prefetch at all: the batch-1 int8
    pair rows (pairs) where FAR_PREFETCH_PAIRS, the other rows where FAR_PREFETCH."""
    return FAR_PREFETCH_PAIRS if pairs else FAR_PREFETCH


def far_prefetch[pairs: Bool = False](task_bytes: Int) -> Bool:
    """Whether a decode task streaming `task_bytes` of weights takes the two-distance prefetch."""
    return far_allowed[pairs]() and task_bytes >= FAR_MIN_TASK_BYTES


@always_inline
def prefetch_stream[far: Bool](p: BytePtr):
    """Prefetches the weight stream ahead of `p`, the distance form fixed at compile time: far, the two
    distances (far_prefetch), else PREFETCH_BYTES. The batch-1 int8 pair rows are compiled for both
    forms and the task picks one (qmatmul_cpu._q8_pairs): a run-time `far` test inside a row kernel's
    loop measured slower by its presence alone, even with far false."""
    comptime if far:
        prefetch[PrefetchOptions().for_read().high_locality()](p.unsafe_offset(FAR_L1_BYTES))
        prefetch[PrefetchOptions().for_read().medium_locality()](p.unsafe_offset(FAR_L2_BYTES))
    elif PREFETCH_BYTES > 0:
        prefetch[PrefetchOptions().for_read().high_locality()](p.unsafe_offset(PREFETCH_BYTES))


@always_inline
def prefetch_ahead(p: BytePtr, far: Bool = False):
    """Prefetches the weight stream ahead of `p`; far: the two-distance form (far_prefetch), tested at
    run time only where FAR_PREFETCH holds."""
    comptime if FAR_PREFETCH:
        if far:
            prefetch_stream[True](p)
            return
    prefetch_stream[False](p)


def block_sums(x: Ptr[F32], nb: Int, xsum: Ptr[F32]):
    """Sets xsum[b] = the sum of x[32 b : 32 b + 32] for b < nb: the float Q4 decode rows' offset term."""
    for b in range(nb):
        xsum[unsafe_offset=b] = (x.unsafe_load[width=HALF](b * QBLOCK) + x.unsafe_load[width=HALF](b * QBLOCK + HALF)).reduce_add()


@always_inline
def qgemv_rows[MROWS: Int, R: Int, qtype: StaticString](
    x: Ptr[F32], xsum: Ptr[F32], w: BytePtr, row_bytes: Int, y: Ptr[F32], n0: Int, N: Int, K: Int, far: Bool = False
):
    # y[m, n0:n0+R] = x[m, :] . dequant(W[n0:n0+R, :]) for m < MROWS. xsum[b] = sum of x[0, block b].
    comptime U = 2 if MROWS * R <= 2 else 1
    comptime if MROWS == 1:
        # Decode rows. Q4: each nibble becomes a float by table lookup (quant.nibble_values; Q4_0's -8
        # sits in the table), the scale d multiplies the block's combined products once, and Q4_1's
        # offset m is applied once per block through the block sum of x, as a scalar. Q8_0 / F16:
        # dot_block.
        comptime q4 = qtype == "q4_0" or qtype == "q4_1"
        comptime q5 = qtype == "q5_0" or qtype == "q5_1"
        comptime head = header_bytes[qtype]()
        # Q4_0's -8: in the AVX-512 lookup table for free; elsewhere nibble_values would spend 4
        # vector adds per block on it, so it joins the offset term as -8d * (block sum of x), as
        # Q4_1's m does. A small gain: the int32 widening and conversions dominate.
        comptime fold_q4_0 = qtype == "q4_0" and not CompilationTarget.has_avx512f()
        comptime base = -8 if qtype == "q4_0" and not fold_q4_0 else 0
        # U independent accumulators per row (blocks b, b + 1, ...): one FMA chain per row would
        # bound a row at one block per FMA latency (~4 cycles per 20-byte block, below DRAM's pace).
        var accu = Array[SIMD[F32, HALF], U * R](fill=SIMD[F32, HALF](0))
        var offset = Array[Float32, U * R](fill=0)
        var nb = K // QBLOCK

        # Whole steps of U blocks without a bounds test each, then the odd blocks; the U chains are
        # added as vectors and summed once per row (they were summed one by one): faster in cache, the
        # same from DRAM, where the reads and the per-op hand-off dominate.
        @always_inline
        def one_block[u: Int](b: Int) {mut accu, mut offset, var x, var xsum, var w, var row_bytes, var n0, var far}:
            var x0 = x.unsafe_load[width=HALF](b * QBLOCK)
            var x1 = x.unsafe_load[width=HALF](b * QBLOCK + HALF)
            comptime for r in range(R):
                var rowp = w.unsafe_offset((n0 + r) * row_bytes)
                var blk = rowp.unsafe_offset(chunk_offset[qtype](b))
                prefetch_ahead(blk, far)
                comptime if q4:
                    var q = blk.unsafe_offset(head).unsafe_load[width=HALF](0).cast[DType.int32]()
                    var t = nibble_values[base](q >> 4).fma(x1, nibble_values[base](q) * x0)
                    comptime if qtype == "q4_1":
                        var dm = block_scales(blk)  # (d, m)
                        accu[u * R + r] = t.fma(SIMD[F32, HALF](dm[0]), accu[u * R + r])
                        offset[u * R + r] += dm[1] * xsum[unsafe_offset=b]
                    else:
                        var d = block_d[HALF](blk)
                        accu[u * R + r] = t.fma(d, accu[u * R + r])
                        comptime if fold_q4_0:
                            offset[u * R + r] += -8.0 * d[0] * xsum[unsafe_offset=b]
                elif q5:
                    # Q5: each quant (nibble | fifth bit << 4) becomes a float by a two-table lookup
                    # (quant.five_bit_values; Q5_0's -16 sits in the tables), the fifth bits moved to
                    # bit 4 of each lane from qh (one 4-byte load). d once per block, and Q5_1's m
                    # through the block sum of x.
                    comptime qh_at = 4 if qtype == "q5_1" else 2
                    comptime base5 = -16 if qtype == "q5_0" else 0
                    var q = blk.unsafe_offset(qh_at + 4).unsafe_load[width=HALF](0).cast[DType.int32]()
                    # qh as 4 bytes (2-byte aligned in Q5_0's 22-byte blocks): an unaligned load.
                    var qh = SIMD[DType.uint32, HALF](bitcast[DType.uint32, 1](blk.unsafe_offset(qh_at).unsafe_load[width=4](0)))
                    # Bit j of qh to bit 4 of lane j (low half), bit j + 16 to bit 4 of lane j (high half).
                    var i_lo = (q & 0xF) | ((qh << 4) >> LANES & 0x10).cast[DType.int32]()
                    var i_hi = (q >> 4) | ((qh >> (LANES + 12)) & 0x10).cast[DType.int32]()
                    var t = five_bit_values[base5](i_hi).fma(x1, five_bit_values[base5](i_lo) * x0)
                    comptime if qtype == "q5_1":
                        var dm = block_scales(blk)  # (d, m)
                        accu[u * R + r] = t.fma(SIMD[F32, HALF](dm[0]), accu[u * R + r])
                        offset[u * R + r] += dm[1] * xsum[unsafe_offset=b]
                    else:
                        accu[u * R + r] = t.fma(block_d[HALF](blk), accu[u * R + r])
                elif qtype == "iq4_nl":
                    # As Q4_0 with the levels' table in place of q - 8 (quant_iq.iq4_levels).
                    var v = iq4_nibbles(blk.unsafe_offset(2))
                    var t = v[1].fma(x1, v[0] * x0)
                    accu[u * R + r] = t.fma(block_d[HALF](blk), accu[u * R + r])
                else:
                    accu[u * R + r] += dot_chunk[qtype](rowp, b, x0, x1)

        var b = 0
        while b + U <= nb:
            comptime for u in range(U):
                one_block[u](b + u)
            b += U
        while b < nb:
            one_block[0](b)
            b += 1
        comptime for r in range(R):
            # One horizontal sum per row: the chains are added as vectors first.
            var sum = accu[r]
            var total = offset[r]
            comptime for u in range(1, U):
                sum += accu[u * R + r]
                total += offset[u * R + r]
            y[unsafe_offset=n0 + r] = total + sum.reduce_add()
        return
    # MROWS > 1: each block decoded once, reused by every x row.
    var acc = Array[SIMD[F32, HALF], MROWS * R](fill=SIMD[F32, HALF](0))
    for b in range(K // QBLOCK):
        comptime for r in range(R):
            prefetch_ahead(w.unsafe_offset((n0 + r) * row_bytes + chunk_offset[qtype](b)), far)
        comptime for r in range(R):
            var v = decode_chunk[qtype](w.unsafe_offset((n0 + r) * row_bytes), b)
            comptime for m in range(MROWS):
                var x0 = x.unsafe_load[width=HALF](m * K + b * QBLOCK)
                var x1 = x.unsafe_load[width=HALF](m * K + b * QBLOCK + HALF)
                acc[m * R + r] = v[1].fma(x1, v[0].fma(x0, acc[m * R + r]))
    comptime for m in range(MROWS):
        comptime for r in range(R):
            y[unsafe_offset=m * N + n0 + r] = acc[m * R + r].reduce_add()
