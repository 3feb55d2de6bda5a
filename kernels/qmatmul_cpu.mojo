# CPU quantized matmul: y[M, N] = x[M, K] @ dequant(Wq)^T, Wq rows of GGUF blocks (quant.mojo).
#
#   qgemv  M <= 32 (decode, and batched decode up to 32 sequences). Memory-bound on the quantized
#          bytes. M = 1 streams one weight row at a time (two accumulator chains, software prefetch
#          4 KB ahead, see PREFETCH_BYTES); the block's scale multiplies the combined products (Q4:
#          per-block offset via x's block sums; Q8_0/F16: dot_block, likewise two chains: with one, Q8_0 rows advanced one
#          block per add latency; in-process A/B: SmolLM2's tied lm_head 49152 x 576 694 -> 578 us,
#          4096 x 4096 673 -> 416 us; sharing the Q4 rows' loop, one horizontal sum per chain, then
#          measured 606-627 -> 566-574 and 427-436 -> 257-258 us). For M > 1 each block is decoded to floats once and
#          reused by up to 8 rows (2 weight rows in flight); M > 8 runs in groups of <= 8 rows, each
#          streaming the weights again. The rows: qgemv_rows.mojo (float x; on AVX-512 hosts M = 1
#          Q4_0 / Q4_1 take qgemv_groups.mojo, 4 blocks at a time in integers, and on AVX2 hosts
#          without VNNI qgemv_octets.mojo, 8 blocks at a time), qgemv_rows_q8.mojo
#          (act = "q8": x quantized to int8 per block, integer block dot products).
#   gemm   M > 32 (prefill). The fp32 GEMM of matmul_cpu.mojo with a packing step that decodes blocks
#          into the KC x NR micro-panel; the float weights never exist beyond that panel.
# Why 32: decode steps of SmolLM2 measured 17 ms at 8 sequences but 54 ms at 9 through the GEMM
# (packing decodes every block into memory and small M cannot amortize it); groups of 8 cost one
# weight pass per group, which stays cheaper than the GEMM up to about 32 rows (16 sequences:
# 58 -> 30 ms; 32: 76 -> 60 ms). One pass of 16 rows (R = 1) measured slower than two of 8.
# Why one row at a time for M = 1: with 4 rows in flight a core read 11 GB/s from DRAM, with one row
# 21 GB/s (23.7 with the prefetch); SmolLM2's batch-1 decode step went from 11.9 to 6.0 ms.

from max.gpu.host import DeviceContext

from .common import BytePtr, F32, Ptr, ceil_div, cpu_threads, parallel_for, scratch
from .matmul_cpu import GEMV_MAX_M, gemm_cpu
from .qdot_int8 import (
    OCTETS, PAIR, PAIR_LANES, I8Ptr, octet_floats, octet_layout_q8, pair_layout_q8, quantize_rows_q8, row_pair_layout_q8,
)
from .qgemv_groups import GROUP_VALUES, GROUP_X, GROUPS_F32, LANES, group_xc, groups_layout, qgemv_row_groups
from .qgemv_octets import OCTET_VALUES, OCTET_X_BYTES, OCTETS_F32, octet_xo, octets_layout, qgemv_row_octets
from .qgemv_rows import block_sums, far_prefetch, qgemv_rows
from .qgemv_rows_q8 import qgemv_row_q8_mpairs, qgemv_row_q8_pairs, qgemv_rows_q8
from .quant import QBLOCK, block_bytes

comptime QGEMV_MAX_M = 32


def _qgemv_m[MROWS: Int, qtype: StaticString, act: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    # One weight row at a time for M = 1: streaming R rows side by side measured half the bandwidth
    # (R = 4: 11 GB/s per core from DRAM vs 21 GB/s for R = 1; the hardware prefetcher follows one
    # stream per core far better). For M > 1 the float path is compute-bound and R = 2 reuses each x
    # load (8 rows: 9.4 ms -> 7.3 ms for SmolLM2's 120 projections); the int8 path measured no gain.
    comptime R = 1 if MROWS == 1 or act == "q8" else 2
    comptime int8_act = act == "q8"
    var tasks = 1 if N * row_bytes < 65536 else cpu_threads() * 2
    var per = ceil_div(ceil_div(N, tasks), R) * R
    var far = far_prefetch(per * row_bytes)
    var nb = K // QBLOCK
    # Float path: block sums of the (first) x row, for the Q4 decode path's offset term.
    # Int8 path: x quantized per block (qdot_int8.mojo), once per call, shared by all tasks.
    var xsum = scratch[F32](nb)
    var qx = rebind[I8Ptr](scratch[DType.int8](MROWS * K if int8_act else 1))
    var dx = scratch[F32](MROWS * nb if int8_act else 1)
    var sx = scratch[F32](MROWS * nb if int8_act else 1)
    # Batch-1 Q4 rows with int8 x: block pairs (qdot_int8.mojo), x rearranged once per call.
    comptime pairs = int8_act and MROWS == 1 and (qtype == "q4_0" or qtype == "q4_1")
    var qx2 = rebind[I8Ptr](scratch[DType.int8](K if pairs else 1))
    var xs2 = scratch[F32]((nb // 2) * 4 if pairs and qtype == "q4_1" else 1)
    var cx2 = scratch[DType.int32]((nb // 2) * PAIR_LANES if pairs and qtype == "q4_0" else 1)
    comptime octets = pairs and OCTETS
    # Batch-1 Q4 rows with float x on AVX-512: groups of 4 blocks (qgemv_groups.mojo), x laid out once.
    comptime groups = GROUPS_F32 and not int8_act and MROWS == 1 and (qtype == "q4_0" or qtype == "q4_1")
    var ng = K // GROUP_VALUES
    var gxp = scratch[F32](ng * GROUP_X * LANES if groups else 1)
    var gxc = scratch[F32](ng * group_xc[qtype]() * LANES if groups else 1)
    # Q4_1 only: per-lane x sums for its m term (the block sums go to xsum).
    var gxs = scratch[F32](ng * LANES if groups and qtype == "q4_1" else 1)
    # Batch-1 Q4 rows with float x on AVX2 without VNNI: octets of 8 blocks (qgemv_octets.mojo).
    comptime f32_octets = OCTETS_F32 and not int8_act and MROWS == 1 and (qtype == "q4_0" or qtype == "q4_1")
    var no = K // OCTET_VALUES
    var oxp = rebind[I8Ptr](scratch[DType.int8](no * OCTET_X_BYTES if f32_octets else 1))
    var oxo = scratch[F32](no * octet_xo[qtype]() if f32_octets else 1)
    var oco = scratch[DType.int32](no * 16 if f32_octets and qtype == "q4_0" else 1)
    var xo = scratch[F32]((nb // 8) * octet_floats[qtype]() if octets else 1)
    var co = scratch[DType.int32]((nb // 8) * 8 if octets and qtype == "q4_0" else 1)
    # Batched int8 x, 3 to 8 rows: two x rows per dot product (row_pair_layout_q8). AMD Zen 3 (AVX2),
    # 4096 x 4096, 8 rows: Q4_1 4.10 -> 2.41 ms, Q8_0 5.26 -> 3.63 ms; at 2 rows the one-row form with
    # two accumulator sets was as fast (Q4_1 1.00 vs 0.96 ms) or faster (Q8_0 1.52 vs 1.68 ms).
    comptime mpairs = int8_act and MROWS > 2
    comptime MP = (MROWS + 1) // 2
    var qxp = rebind[I8Ptr](scratch[DType.int8](nb * MP * PAIR if mpairs else 1))
    var dxp = scratch[F32](nb * MP * 16 if mpairs else 1)
    var sxp = scratch[F32](nb * 8 if mpairs else 1)
    comptime if int8_act:
        quantize_rows_q8(x, MROWS, K, qx, dx, sx)
        comptime if pairs:
            # With octets only the pairs after the last whole octet read xs2 / cx2.
            pair_layout_q8[qtype](qx, dx, sx, nb, qx2, xs2, cx2, (nb // 8) * 4 if octets else 0)
        comptime if octets:
            octet_layout_q8[qtype](qx, dx, sx, nb, xo, co)
        comptime if mpairs:
            row_pair_layout_q8(qx, dx, sx, MROWS, nb, qxp, dxp, sxp)
    elif groups:
        groups_layout[qtype](x, K, gxp, gxc, gxs, xsum)
    elif f32_octets:
        octets_layout[qtype](x, K, oxp, oxo, oco)
    else:
        block_sums(x, nb, xsum)

    def task(t: Int) {var y, var x, var xsum, var qx, var dx, var sx, var qx2, var xs2, var cx2, var xo, var co, var qxp,
                      var dxp, var sxp, var gxp, var gxc, var gxs, var oxp, var oxo, var oco, var w, var row_bytes,
                      var N, var K, var per, var far}:
        var n = t * per
        var end = min(N, n + per)
        comptime if groups:
            while n < end:
                qgemv_row_groups[qtype](x, gxp, gxc, gxs, xsum, w, row_bytes, y, n, K, far)
                n += 1
            return
        comptime if f32_octets:
            while n < end:
                qgemv_row_octets[qtype](x, oxp, oxo, oco, w, row_bytes, y, n, K, far)
                n += 1
            return
        comptime if mpairs:
            while n < end:
                qgemv_row_q8_mpairs[MROWS, qtype](qxp, dxp, sxp, w, row_bytes, y, n, N, K, far)
                n += 1
            return
        comptime if pairs:
            while n < end:
                qgemv_row_q8_pairs[qtype](qx2, xs2, cx2, xo, co, qx, dx, sx, w, row_bytes, y, n, K, far)
                n += 1
            return
        while n + R <= end:
            comptime if int8_act:
                qgemv_rows_q8[MROWS, R, qtype](qx, dx, sx, w, row_bytes, y, n, N, K, far)
            else:
                qgemv_rows[MROWS, R, qtype](x, xsum, w, row_bytes, y, n, N, K, far)
            n += R
        while n < end:
            comptime if int8_act:
                qgemv_rows_q8[MROWS, 1, qtype](qx, dx, sx, w, row_bytes, y, n, N, K, far)
            else:
                qgemv_rows[MROWS, 1, qtype](x, xsum, w, row_bytes, y, n, N, K, far)
            n += 1

    if tasks == 1:
        task(0)
    else:
        parallel_for(task, tasks, ctx)
    xsum.unsafe_free()
    qx.unsafe_free()
    dx.unsafe_free()
    sx.unsafe_free()
    qx2.unsafe_free()
    xs2.unsafe_free()
    cx2.unsafe_free()
    xo.unsafe_free()
    co.unsafe_free()
    qxp.unsafe_free()
    dxp.unsafe_free()
    sxp.unsafe_free()
    gxp.unsafe_free()
    gxc.unsafe_free()
    gxs.unsafe_free()
    oxp.unsafe_free()
    oxo.unsafe_free()
    oco.unsafe_free()


def qmatmul_cpu[qtype: StaticString, act: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    """Computes y = x @ dequant(w)^T; K must be a multiple of 32 (checked by the op).

    act "q8" quantizes x to int8 per block on the decode path (M <= 32); the GEMM keeps float32.
    """
    var row_bytes = (K // QBLOCK) * block_bytes[qtype]()
    if M > QGEMV_MAX_M:
        gemm_cpu[qtype](y, x, w, row_bytes, M, N, K, ctx)
        return
    var m0 = 0
    while m0 < M:
        # Balanced groups (M = 9 runs 5 + 4, not 8 + 1): fewer rows per pass cost a little less.
        var groups = ceil_div(M - m0, GEMV_MAX_M)
        var rows = ceil_div(M - m0, groups)
        comptime for m in range(1, GEMV_MAX_M + 1):
            if rows == m:
                _qgemv_m[m, qtype, act](y.unsafe_offset(m0 * N), x.unsafe_offset(m0 * K), w, row_bytes, N, K, ctx)
        m0 += rows
