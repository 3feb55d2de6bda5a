# Standalone batch-1 qmatmul driver for profiling (M = 1, Q4_0 and Q4_1; act = "q8": qgemv_rows_q8.mojo,
# act = "f32": qgemv_rows.mojo, qgemv_groups.mojo, qgemv_octets.mojo): no graph, no JIT, so
# `perf annotate` sees the row kernels' instructions.
# Timing only, no baseline: speed claims belong to `crucible bench kernels`.
#
#   .venv/bin/mojo build -I . -O3 benchmarks/profile_qmatmul.mojo -o /tmp/profile_qmatmul
#   /tmp/profile_qmatmul [N K reps]                     (default: 128 4096 100)
#   perf record -o /tmp/perf.data /tmp/profile_qmatmul && perf annotate -i /tmp/perf.data --stdio
#
# Numbers per block format:
#   row kernel, one core: qgemv_row_q8_pairs over N rows of K, the weights cache-resident (N x K small
#     enough for L2), best of `reps` timings of 20 passes: the compute cost per 32-value block.
#   f32 row kernel, one core: the same for float activations (act = "f32", qgemv_rows[1, 1]).
#   f32 group rows, one core (AVX-512 hosts): qgemv_row_groups, which act = "f32" M = 1 runs there.
#   f32 octet rows, one core (AVX2 hosts without VNNI): qgemv_row_octets, which act = "f32" M = 1 runs
#     there.
#   whole op (act = "q8", then "f32"): qmatmul_cpu on both cores over distinct weight copies totalling
#     >= 64 MB, so the weights stream from DRAM as in a model's decode step, with its parallel hand-off.
# Weights are synthetic bytes with valid half-precision headers; the printed checksum only keeps the
# compiler from dropping the work (the conformance grid checks results).

from max.gpu.host import DeviceContext
from std.sys import argv
from std.time import perf_counter_ns

from kernels.common import BytePtr, F32, Ptr, scratch
from kernels.qdot_int8 import I8Ptr, octet_floats, octet_layout_q8, pair_layout_q8, quantize_rows_q8
from kernels.qgemv_groups import GROUPS_F32, groups_layout, groups_x_sizes, qgemv_row_groups
from kernels.qgemv_octets import OCTET_VALUES, OCTET_X_BYTES, OCTETS_F32, octet_xo, octets_layout, qgemv_row_octets
from kernels.qgemv_rows import block_sums, qgemv_rows
from kernels.qgemv_rows_q8 import qgemv_row_q8_pairs
from kernels.qmatmul_cpu import qmatmul_cpu
from kernels.quant import QBLOCK, block_bytes


def _weights[qtype: StaticString](rows: Int, K: Int) -> BytePtr:
    # rows x K weights as GGUF blocks: pseudo-random nibbles, headers d = 2^-15 (0x0200), Q4_1 m = -2^-15.
    comptime bb = block_bytes[qtype]()
    var nblocks = rows * (K // QBLOCK)
    var w = rebind[BytePtr](scratch[DType.uint8](nblocks * bb))
    for i in range(nblocks * bb):
        w[unsafe_offset=i] = UInt8((i * 7919 + 13) % 251)
    for b in range(nblocks):
        var p = w.unsafe_offset(b * bb)
        p[unsafe_offset=0] = 0x00
        p[unsafe_offset=1] = 0x02
        comptime if qtype == "q4_1":
            p[unsafe_offset=2] = 0x00
            p[unsafe_offset=3] = 0x82
    return w


def _best_pass_ns[Body: def() -> None](body: Body, reps: Int) -> Float64:
    """Best of `reps` timings of 20 calls of body, in ns per call."""
    var best = Float64(1e30)
    for _ in range(reps):
        var t0 = perf_counter_ns()
        for _ in range(20):
            body()
        best = min(best, Float64(perf_counter_ns() - t0) / 20.0)
    return best


def _whole_op[qtype: StaticString, act: StaticString](
    yo: Ptr[F32], x: Ptr[F32], ws: BytePtr, op_bytes: Int, N: Int, K: Int, copies: Int, passes: Int, ctx: DeviceContext
) raises -> Float32:
    """Times qmatmul_cpu over `copies` distinct N x K weight copies from DRAM; prints and returns y[0]."""
    for c in range(copies):
        qmatmul_cpu[qtype, act](yo, x, ws.unsafe_offset(c * op_bytes), 1, N, K, ctx, N)
    var t0 = perf_counter_ns()
    for _ in range(passes):
        for c in range(copies):
            qmatmul_cpu[qtype, act](yo, x, ws.unsafe_offset(c * op_bytes), 1, N, K, ctx, N)
    var per_op = Float64(perf_counter_ns() - t0) / Float64(passes * copies)
    print(qtype, "whole op, all cores, from DRAM, N", N, "K", K, "copies", copies, ":", per_op / 1000.0, "us per op,",
          Float64(op_bytes) / per_op, "GB/s of weights, act", act)
    return yo[unsafe_offset=0]


def profile[qtype: StaticString](N: Int, K: Int, reps: Int, ctx: DeviceContext) raises:
    comptime bb = block_bytes[qtype]()
    var nb = K // QBLOCK
    var row_bytes = nb * bb
    var x = scratch[F32](K)
    for i in range(K):
        x[unsafe_offset=i] = Float32((i * 37) % 101) * 0.01 - 0.5
    var y = scratch[F32](N)
    # x in the block-pair layout, as _qgemv_m prepares it once per call.
    var qx = rebind[I8Ptr](scratch[DType.int8](K))
    var dx = scratch[F32](nb)
    var sx = scratch[F32](nb)
    var qx2 = rebind[I8Ptr](scratch[DType.int8](K))
    var xs2 = scratch[F32](2 * nb)
    var cx2 = scratch[DType.int32](8 * nb)
    quantize_rows_q8(x, 1, K, qx, dx, sx)
    pair_layout_q8[qtype](qx, dx, sx, nb, qx2, xs2, cx2)
    var xo = scratch[F32]((nb // 8) * octet_floats[qtype]() + 1)
    var co = scratch[DType.int32]((nb // 8) * 8 + 1)
    octet_layout_q8[qtype](qx, dx, sx, nb, xo, co)

    var w = _weights[qtype](N, K)

    def rows_q8() {var qx2, var xs2, var cx2, var xo, var co, var qx, var dx, var sx, var w, var row_bytes, var y,
                   var N, var K}:
        for n in range(N):
            qgemv_row_q8_pairs[qtype](qx2, xs2, cx2, xo, co, qx, dx, sx, w, row_bytes, y, n, K)

    var best = _best_pass_ns(rows_q8, reps)
    var check = y[unsafe_offset=0]
    print(qtype, "row kernel, one core, cache-resident, N", N, "K", K, ":", best / Float64(N * nb), "ns per block,",
          Float64(N * row_bytes) / best, "GB/s of weights")

    # The float-activation row kernel (act = "f32", qgemv_rows[1, 1]) on the same weights, for comparison.
    var xsum = scratch[F32](nb)
    block_sums(x, nb, xsum)

    def rows_f32() {var x, var xsum, var w, var row_bytes, var y, var N, var K}:
        for n in range(N):
            qgemv_rows[1, 1, qtype](x, xsum, w, row_bytes, y, n, N, K)

    var best_f32 = _best_pass_ns(rows_f32, reps)
    print(qtype, "f32 row kernel, one core, cache-resident, N", N, "K", K, ":", best_f32 / Float64(N * nb),
          "ns per block (checksum", y[unsafe_offset=0], ")")
    xsum.unsafe_free()

    # The AVX-512 group rows that act = "f32" M = 1 runs there instead (qgemv_groups.mojo).
    comptime if GROUPS_F32:
        var sizes = groups_x_sizes[qtype](K)
        var gxp = scratch[F32](sizes[0])
        var gxo = scratch[F32](sizes[1])
        var gxs = scratch[F32](sizes[2])
        var gxb = scratch[F32](sizes[3])
        groups_layout[qtype](x, K, gxp, gxo, gxs, gxb)

        def rows_groups() {var x, var gxp, var gxo, var gxs, var gxb, var w, var row_bytes, var y, var N, var K}:
            for n in range(N):
                qgemv_row_groups[qtype](x, gxp, gxo, gxs, gxb, w, row_bytes, y, n, K)

        var best_groups = _best_pass_ns(rows_groups, reps)
        print(qtype, "f32 group rows, one core, cache-resident, N", N, "K", K, ":", best_groups / Float64(N * nb),
              "ns per block (checksum", y[unsafe_offset=0], ")")
        gxp.unsafe_free()
        gxo.unsafe_free()
        gxs.unsafe_free()
        gxb.unsafe_free()

    # The AVX2 octet rows that act = "f32" M = 1 runs there instead (qgemv_octets.mojo).
    comptime if OCTETS_F32:
        var no = K // OCTET_VALUES
        var oxp = rebind[I8Ptr](scratch[DType.int8](no * OCTET_X_BYTES + 1))
        var oxo = scratch[F32](no * octet_xo[qtype]() + 1)
        var oco = scratch[DType.int32](no * 16 + 1)
        octets_layout[qtype](x, K, oxp, oxo, oco)

        def rows_octets() {var x, var oxp, var oxo, var oco, var w, var row_bytes, var y, var N, var K}:
            for n in range(N):
                qgemv_row_octets[qtype](x, oxp, oxo, oco, w, row_bytes, y, n, K)

        var best_octets = _best_pass_ns(rows_octets, reps)
        print(qtype, "f32 octet rows, one core, cache-resident, N", N, "K", K, ":", best_octets / Float64(N * nb),
              "ns per block (checksum", y[unsafe_offset=0], ")")
        oxp.unsafe_free()
        oxo.unsafe_free()
        oco.unsafe_free()

    # Whole op from DRAM: copies of a 4096 x K matrix totalling >= 64 MB.
    comptime OP_N = 4096
    var op_bytes = OP_N * row_bytes
    var copies = max(2, ((64 << 20) + op_bytes - 1) // op_bytes)
    var ws = _weights[qtype](OP_N * copies, K)
    var yo = scratch[F32](OP_N)
    var checks = check
    comptime for act in ["q8", "f32"]:
        checks += _whole_op[qtype, act](yo, x, ws, op_bytes, OP_N, K, copies, max(1, reps // 10), ctx)
    print(qtype, "(checksum", checks, ")")
    w.unsafe_free()
    ws.unsafe_free()
    x.unsafe_free()
    y.unsafe_free()
    dx.unsafe_free()
    sx.unsafe_free()
    xs2.unsafe_free()
    yo.unsafe_free()
    qx.unsafe_free()
    qx2.unsafe_free()
    cx2.unsafe_free()
    xo.unsafe_free()
    co.unsafe_free()


def main() raises:
    var args = argv()
    var N = atol(args[1]) if len(args) > 1 else 128
    var K = atol(args[2]) if len(args) > 2 else 4096
    var reps = atol(args[3]) if len(args) > 3 else 100
    if K % 64 != 0:
        raise Error("K must be a multiple of 64 (whole block pairs) for this driver")
    var ctx = DeviceContext(api="cpu")
    profile["q4_0"](N, K, reps, ctx)
    profile["q4_1"](N, K, reps, ctx)
