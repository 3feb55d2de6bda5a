# CPU quantized matmul: y[M, N] = x[M, K] @ dequant(Wq)^T, Wq rows of GGUF blocks (quant.mojo).
#
#   qgemv  M <= 32 (decode, and batched decode up to 32 sequences), in groups of up to 8 rows of x.
#          Memory-bound on the quantized bytes: each block is decoded in registers and used by every
#          row of its group. The rows: qgemv_rows.mojo (float x; M = 1 Q4_0 / Q4_1 take
#          qgemv_groups.mojo on AVX-512BW and qgemv_octets.mojo on AVX2 without VNNI; M = 1 K-quants and
#          IQ4_XS take qgemv_ksuper.mojo) and
#          qgemv_rows_q8.mojo (act = "q8": x quantized to int8 per block; the K-quants take
#          qgemv_ksuper_q8.mojo).
#   gemm   M > 32 (prefill). The fp32 GEMM of gemm_cpu.mojo with a packing step that decodes blocks
#          into the KC x NR micro-panel; the float weights never exist beyond that panel.
# Why 32: the GEMM decodes every block into memory, which small M cannot amortize; groups of 8 cost
# one weight pass per group, which stays cheaper than the GEMM up to about 32 rows.
# Why one weight row at a time for M = 1: the hardware prefetcher follows one stream per core far
# better than several; M > 1 is compute-bound and takes two rows, reusing each x load.

from max.gpu.host import DeviceContext

from .common import BytePtr, F32, Ptr, ceil_div, cpu_threads, parallel_for, scratch
from .gemm_cpu import gemm_cpu
from .gemv_cpu import GEMV_MAX_M
from .qdot_int8 import (
    OCTETS, PAIR, PAIR_LANES, I8Ptr, octet_floats, octet_layout_q8, pair_layout_q8, quantize_rows_q8, row_pair_layout_q8,
)
from .qgemv_ksuper import qgemv_row_k
from .qgemv_ksuper_q8 import kq8_layout, kq8_permutes_x, kq8_uses_xh, qgemv_row_k_q8
from .qgemv_groups import GROUPS_F32, groups_layout, groups_x_sizes, qgemv_row_groups
from .qgemv_octets import OCTET_VALUES, OCTET_X_BYTES, OCTETS_F32, octet_xo, octets_layout, qgemv_row_octets
from .qgemv_rows import block_sums, far_allowed, far_prefetch, qgemv_rows
from .qgemv_rows_q8 import qgemv_row_q8_mpairs, qgemv_row_q8_pairs, qgemv_rows_q8
from .quant import QBLOCK, is_super, row_bytes_of
from .quant_k import is_kquant

comptime QGEMV_MAX_M = 32


@fieldwise_init
struct RowSpan(ImplicitlyCopyable, Movable):
    """The weight rows (output columns) [lo, hi) one call computes, y's row stride, and whether the
    call splits them over the cores (a whole op) or runs them on the calling thread (one task of
    crucible.qmatmul2, which splits all its weights' rows in one hand-off)."""

    var lo: Int
    var hi: Int
    var ldy: Int
    var serial: Bool


def task_count(weight_bytes: Int) -> Int:
    """Tasks for a decode pass over weight_bytes: one under 64 KB (the hand-off costs more than it
    saves), else two per core."""
    return 1 if weight_bytes < 65536 else cpu_threads() * 2


def _for_rows[R: Int, RowFn: def(Int, Int, Bool) -> None, pairs: Bool = False](
    row: RowFn, span: RowSpan, row_bytes: Int, ctx: DeviceContext
):
    """Calls row(n, r, far) for weight rows [n, n + r) covering span: r = R, then single rows at each task's end.

    A parallel span runs as task_count tasks in runs of whole R-row steps; a serial one as one task.
    far: whether a task streams enough bytes for the far prefetch (pairs: the rows are batch-1 int8
    pairs, which take it on more hosts; far_allowed).
    """
    def run(lo: Int, hi: Int, far: Bool) {imm row}:
        var n = lo
        while n + R <= hi:
            row(n, R, far)
            n += R
        while n < hi:
            row(n, 1, far)
            n += 1

    var rows = span.hi - span.lo
    if span.serial:
        run(span.lo, span.hi, far_prefetch[pairs](rows * row_bytes))
        return
    var tasks = task_count(rows * row_bytes)
    var per = ceil_div(ceil_div(rows, tasks), R) * R
    var far = far_prefetch[pairs](per * row_bytes)

    def task(t: Int) {imm run, var span, var per, var far}:
        var lo = span.lo + t * per
        run(lo, min(span.hi, lo + per), far)

    if tasks == 1:
        task(0)
    else:
        parallel_for(task, tasks, ctx)


def _rows_f32[MROWS: Int, qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan, ctx: DeviceContext
):
    # Float x, every qtype and M (qgemv_rows.mojo). One weight row at a time for M = 1: streaming R
    # rows side by side measured about half the bandwidth from DRAM (the hardware prefetcher follows
    # one stream per core far better). For M > 1 the path is compute-bound and R = 2 reuses each x
    # load.
    comptime R = 1 if MROWS == 1 else 2
    var xsum = scratch[F32](K // QBLOCK)  # block sums of the first x row: the Q4 offset term
    block_sums(x, K // QBLOCK, xsum)

    def row(n: Int, r: Int, far: Bool) {var y, var x, var xsum, var w, var row_bytes, var span, var K}:
        comptime if MROWS == 1 and is_super[qtype]():
            qgemv_row_k[qtype](x, xsum, w, row_bytes, y, n, K, far)
            return
        if r == R:
            qgemv_rows[MROWS, R, qtype](x, xsum, w, row_bytes, y, n, span.ldy, K, far)
        else:
            qgemv_rows[MROWS, 1, qtype](x, xsum, w, row_bytes, y, n, span.ldy, K, far)

    _for_rows[R](row, span, row_bytes, ctx)
    xsum.unsafe_free()


def _groups_f32[qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan, ctx: DeviceContext
):
    # Float x, M = 1, Q4 on AVX-512: groups of 4 blocks in integers (qgemv_groups.mojo), x laid out once.
    var sizes = groups_x_sizes[qtype](K)
    var xp = scratch[F32](sizes[0])
    var xo = scratch[F32](sizes[1])  # Q4_0's offset sums
    var xs = scratch[F32](sizes[2])  # block scales
    var xb = scratch[F32](sizes[3])  # Q4_1's block sums of x (its m term)
    groups_layout[qtype](x, K, xp, xo, xs, xb)

    def row(n: Int, r: Int, far: Bool) {var y, var x, var xp, var xo, var xs, var xb, var w, var row_bytes, var K}:
        qgemv_row_groups[qtype](x, xp, xo, xs, xb, w, row_bytes, y, n, K, far)

    _for_rows[1](row, span, row_bytes, ctx)
    xp.unsafe_free()
    xo.unsafe_free()
    xs.unsafe_free()
    xb.unsafe_free()


def _octets_f32[qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan, ctx: DeviceContext
):
    # Float x, M = 1, Q4 on AVX2 without VNNI: octets of 8 blocks in integers (qgemv_octets.mojo).
    var no = K // OCTET_VALUES
    var xp = rebind[I8Ptr](scratch[DType.int8](no * OCTET_X_BYTES))
    var xo = scratch[F32](no * octet_xo[qtype]())
    var co = scratch[DType.int32](no * 16 if qtype == "q4_0" else 1)  # Q4_0's -8 offsets
    octets_layout[qtype](x, K, xp, xo, co)

    def row(n: Int, r: Int, far: Bool) {var y, var x, var xp, var xo, var co, var w, var row_bytes, var K}:
        qgemv_row_octets[qtype](x, xp, xo, co, w, row_bytes, y, n, K, far)

    _for_rows[1](row, span, row_bytes, ctx)
    xp.unsafe_free()
    xo.unsafe_free()
    co.unsafe_free()


def _q8_pairs[qtype: StaticString](
    y: Ptr[F32], qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan,
    ctx: DeviceContext,
):
    # Int8 x, M = 1, Q4: block pairs (qdot_int8.mojo), and octets of 8 blocks where OCTETS; x
    # rearranged once per call. With octets only the pairs after the last whole octet read xs2 / cx2.
    # The pair rows take the far prefetch on more hosts than the other rows (far_allowed).
    var nb = K // QBLOCK
    var qx2 = rebind[I8Ptr](scratch[DType.int8](K))
    var xs2 = scratch[F32]((nb // 2) * 4 if qtype == "q4_1" else 1)
    var cx2 = scratch[DType.int32]((nb // 2) * PAIR_LANES if qtype == "q4_0" else 1)
    var xo = scratch[F32]((nb // 8) * octet_floats[qtype]() if OCTETS else 1)
    var co = scratch[DType.int32]((nb // 8) * 8 if OCTETS and qtype == "q4_0" else 1)
    pair_layout_q8[qtype](qx, dx, sx, nb, qx2, xs2, cx2, (nb // 8) * 4 if OCTETS else 0)
    comptime if OCTETS:
        octet_layout_q8[qtype](qx, dx, sx, nb, xo, co)

    def row(n: Int, r: Int, far: Bool) {var y, var qx, var dx, var sx, var qx2, var xs2, var cx2, var xo, var co,
                                        var w, var row_bytes, var K}:
        # The prefetch form is a compile-time parameter of the row kernel (qgemv_rows.prefetch_stream).
        comptime if far_allowed[pairs=True]():
            if far:
                qgemv_row_q8_pairs[qtype, FAR=True](qx2, xs2, cx2, xo, co, qx, dx, sx, w, row_bytes, y, n, K)
                return
        qgemv_row_q8_pairs[qtype, FAR=False](qx2, xs2, cx2, xo, co, qx, dx, sx, w, row_bytes, y, n, K)

    _for_rows[1, pairs=True](row, span, row_bytes, ctx)
    qx2.unsafe_free()
    xs2.unsafe_free()
    cx2.unsafe_free()
    xo.unsafe_free()
    co.unsafe_free()


def _q8_mpairs[MROWS: Int, qtype: StaticString](
    y: Ptr[F32], qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan,
    ctx: DeviceContext,
):
    # Int8 x, 3 to 8 rows: two x rows per dot product (row_pair_layout_q8), faster at 8 rows; at 2
    # rows the one-row form with two accumulator sets was as fast or faster.
    comptime MP = (MROWS + 1) // 2
    var nb = K // QBLOCK
    var qxp = rebind[I8Ptr](scratch[DType.int8](nb * MP * PAIR))
    var dxp = scratch[F32](nb * MP * 16)
    var sxp = scratch[F32](nb * 8)
    row_pair_layout_q8(qx, dx, sx, MROWS, nb, qxp, dxp, sxp)

    def row(n: Int, r: Int, far: Bool) {var y, var qxp, var dxp, var sxp, var w, var row_bytes, var span, var K}:
        qgemv_row_q8_mpairs[MROWS, qtype](qxp, dxp, sxp, w, row_bytes, y, n, span.ldy, K, far)

    _for_rows[1](row, span, row_bytes, ctx)
    qxp.unsafe_free()
    dxp.unsafe_free()
    sxp.unsafe_free()


def _k_q8[MROWS: Int, qtype: StaticString](
    y: Ptr[F32], qx: I8Ptr, dx: Ptr[F32], sx: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan,
    ctx: DeviceContext,
):
    # Int8 x, the K-quants, up to 8 rows per weight pass (qgemv_ksuper_q8.mojo), x laid out once.
    var qxk = rebind[I8Ptr](scratch[DType.int8](MROWS * K if kq8_permutes_x[qtype]() else 1))
    var xh = scratch[F32](MROWS * (K // 16) if kq8_uses_xh[qtype]() else 1)
    kq8_layout[qtype](qx, dx, MROWS, K, qxk, xh)
    var xk = qxk if kq8_permutes_x[qtype]() else qx

    def row(n: Int, r: Int, far: Bool) {var y, var xk, var dx, var sx, var xh, var w, var row_bytes, var span, var K}:
        qgemv_row_k_q8[MROWS, qtype](xk, dx, sx, xh, w, row_bytes, y, n, span.ldy, K, far)

    _for_rows[1](row, span, row_bytes, ctx)
    qxk.unsafe_free()
    xh.unsafe_free()


def _rows_q8[MROWS: Int, qtype: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan, ctx: DeviceContext
):
    # Int8 x (act = "q8"): x quantized per block once per call (qdot_int8.mojo), shared by all tasks
    # (crucible.qmatmul2's tasks each call this on their own span, so quantize x once per task),
    # then the layout of the M = 1 Q4 pairs, of 3+ rows, or the plain int8 rows (one weight row at a
    # time: two rows side by side measured no gain on this path).
    comptime q4 = qtype == "q4_0" or qtype == "q4_1"
    var nb = K // QBLOCK
    var qx = rebind[I8Ptr](scratch[DType.int8](MROWS * K))
    var dx = scratch[F32](MROWS * nb)
    var sx = scratch[F32](MROWS * nb)
    quantize_rows_q8(x, MROWS, K, qx, dx, sx)
    comptime if is_kquant[qtype]():
        _k_q8[MROWS, qtype](y, qx, dx, sx, w, row_bytes, K, span, ctx)
    elif MROWS == 1 and q4:
        _q8_pairs[qtype](y, qx, dx, sx, w, row_bytes, K, span, ctx)
    elif MROWS > 2:
        _q8_mpairs[MROWS, qtype](y, qx, dx, sx, w, row_bytes, K, span, ctx)
    else:

        def row(n: Int, r: Int, far: Bool) {var y, var qx, var dx, var sx, var w, var row_bytes, var span, var K}:
            qgemv_rows_q8[MROWS, 1, qtype](qx, dx, sx, w, row_bytes, y, n, span.ldy, K, far)

        _for_rows[1](row, span, row_bytes, ctx)
    qx.unsafe_free()
    dx.unsafe_free()
    sx.unsafe_free()


def _qgemv_m[MROWS: Int, qtype: StaticString, act: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, row_bytes: Int, K: Int, span: RowSpan, ctx: DeviceContext
):
    # y[MROWS, N] = x[MROWS, K] @ dequant(w)^T, on the path the activation form, M, qtype and host take.
    # Each path allocates only its own scratch.
    comptime q4_row = MROWS == 1 and (qtype == "q4_0" or qtype == "q4_1")
    comptime if act == "q8":
        _rows_q8[MROWS, qtype](y, x, w, row_bytes, K, span, ctx)
    elif q4_row and GROUPS_F32:
        _groups_f32[qtype](y, x, w, row_bytes, K, span, ctx)
    elif q4_row and OCTETS_F32:
        _octets_f32[qtype](y, x, w, row_bytes, K, span, ctx)
    else:
        _rows_f32[MROWS, qtype](y, x, w, row_bytes, K, span, ctx)


def qgemv_cpu[qtype: StaticString, act: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, M: Int, K: Int, span: RowSpan, ctx: DeviceContext
):
    """y[m, n] (at y + m * span.ldy + n) = x[m, :] @ dequant(w[n])^T for m < M <= QGEMV_MAX_M and n in span."""
    var row_bytes = row_bytes_of[qtype](K)
    var m0 = 0
    while m0 < M:
        # Balanced groups (M = 9 runs 5 + 4, not 8 + 1): fewer rows per pass cost a little less.
        var groups = ceil_div(M - m0, GEMV_MAX_M)
        var rows = ceil_div(M - m0, groups)
        comptime for m in range(1, GEMV_MAX_M + 1):
            if rows == m:
                _qgemv_m[m, qtype, act](y.unsafe_offset(m0 * span.ldy), x.unsafe_offset(m0 * K), w, row_bytes, K, span, ctx)
        m0 += rows


def qmatmul_cpu[qtype: StaticString, act: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: BytePtr, M: Int, N: Int, K: Int, ctx: DeviceContext, ldy: Int
) raises:
    """Computes y = x @ dequant(w)^T, y's rows ldy apart (N for a plain [M, N] y); K must be a multiple
    of 32 (checked by the op).

    act "q8" quantizes x to int8 per block on the decode path (M <= 32); the GEMM keeps float32.
    """
    if M > QGEMV_MAX_M:
        gemm_cpu[qtype](y, x, w, row_bytes_of[qtype](K), M, N, K, ctx, ldy)
        return
    qgemv_cpu[qtype, act](y, x, w, M, K, RowSpan(0, N, ldy, False), ctx)
