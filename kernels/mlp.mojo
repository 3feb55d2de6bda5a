# crucible.mlp: a gated MLP over GGUF block weights in one op:
#   h[M, I] = act(x[M, H] @ dequant(Wg)^T) * (x @ dequant(Wu)^T),   y[M, H] = h @ dequant(Wd)^T
#
# Parameters:
#   qg, qu, qd  the block format of gate, up and down (crucible.qmatmul's qtype; equal or not).
#   act         crucible.qmatmul's activation form ("f32" | "q8") for all three.
#   gate        "silu" (SwiGLU) or "gelu_tanh" (Gemma's GeGLU).
# Why: crucible.qmatmul2 (gate|up with the gated epilogue) and crucible.qmatmul (down) are two parallel
# ops, each paying a dispatch and a hand-off to the cores; a phase boundary inside one hand-off costs a
# small fraction of that (common.parallel_phases; benchmarks/op_overhead.py prints both). On CPU,
# decode (M <= 32) is one hand-off of two phases: the tasks of qmatmul2's gated pass into h, then the
# tasks of down's rows, each reading all of h. Prefill runs qmatmul2's and qmatmul's own paths, one
# after the other. On GPU: qmatmul2's launches into h, then qmatmul's.
# Every value is computed as crucible.qmatmul2 then crucible.qmatmul compute it (the same row
# functions, the same x quantization per task for act = "q8"): the result is the unfused ops' bit for
# bit, but for subnormal values, which a worker thread may flush to zero (mlp_checks.py).

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .common import BytePtr, F32, FW, Ptr, ceil_div, cpu_threads, parallel_phases, scratch
from .qmatmul2 import qmatmul2_cpu, qmatmul2_gpu
from .qmatmul_cpu import QGEMV_MAX_M, RowSpan, qgemv_cpu, qmatmul_cpu, task_count
from .qmatmul_gpu import qmatmul_gpu
from .quant import block_values, has_q8_rows, row_bytes_of
from .silu_mul import silu_mul_block


def mlp_cpu[qg: StaticString, qu: StaticString, qd: StaticString, act: StaticString, gate: StaticString](
    y: Ptr[F32], x: Ptr[F32], wg: BytePtr, wu: BytePtr, wd: BytePtr, M: Int, H: Int, I: Int, ctx: DeviceContext
) raises:
    # y: [M, H], x: [M, H]; h: [M, I] scratch between the two passes.
    var h = scratch[F32](M * I)
    if M > QGEMV_MAX_M:
        qmatmul2_cpu[qg, qu, act, gate](h, x, wg, wu, M, I, I, H, ctx)
        qmatmul_cpu[qd, act](y, h, wd, M, H, I, ctx, H)
        h.unsafe_free()
        return
    # gu: [M, 2I] = [gate | up] rows, as qmatmul2's gated path keeps them.
    var gu = scratch[F32](M * 2 * I)
    # Phase 0: qmatmul2's tasks and shares (whole vectors of columns); phase 1: down's rows in whole
    # vectors too (whole R-steps: FW is a multiple of R).
    var t_up = task_count(I * (row_bytes_of[qg](H) + row_bytes_of[qu](H)))
    var per_up = ceil_div(ceil_div(I, t_up), FW) * FW
    # With int8 activations every down task quantizes all of h (qgemv_cpu over a serial span): one
    # task per core, so each core quantizes it once.
    var t_down = task_count(H * row_bytes_of[qd](I))
    comptime if act == "q8":
        t_down = min(t_down, cpu_threads())
    var per_down = ceil_div(ceil_div(H, t_down), FW) * FW

    def item(p: Int, t: Int) {var y, var x, var wg, var wu, var wd, var M, var H, var I, var h, var gu,
                                var t_up, var per_up, var t_down, var per_down, var ctx}:
        if p == 0:
            var lo = min(I, t * per_up)
            var hi = min(I, lo + per_up)
            if t < t_up and lo < hi:
                qgemv_cpu[qg, act](gu, x, wg, M, H, RowSpan(lo, hi, 2 * I, True), ctx)
                qgemv_cpu[qu, act](gu.unsafe_offset(I), x, wu, M, H, RowSpan(lo, hi, 2 * I, True), ctx)
                silu_mul_block[gate](h, gu, 0, M, lo, hi, I)
        else:
            var lo = min(H, t * per_down)
            var hi = min(H, lo + per_down)
            if t < t_down and lo < hi:
                qgemv_cpu[qd, act](y, h, wd, M, I, RowSpan(lo, hi, H, True), ctx)

    parallel_phases(item, max(t_up, t_down), 2, ctx)
    gu.unsafe_free()
    h.unsafe_free()


@extensibility.register("crucible.mlp")
struct Mlp:
    @staticmethod
    def execute[target: StaticString, qg: StaticString, qu: StaticString, qd: StaticString,
                act: StaticString = "f32", gate: StaticString = "silu"](
        y: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=y.dtype, rank=2, ...],
        wg: InputTensor[dtype=DType.uint8, rank=2, ...],
        wu: InputTensor[dtype=DType.uint8, rank=2, ...],
        wd: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert gate == "silu" or gate == "gelu_tanh", "crucible.mlp: gate is silu or gelu_tanh"
        comptime assert act == "f32" or act == "q8", "crucible.mlp: act is f32 or q8"
        comptime assert act == "f32" or (
            has_q8_rows[qg]() and has_q8_rows[qu]() and has_q8_rows[qd]() and target == "cpu"
        ), "act=q8: the linear GGUF block formats (not F16 / BF16 / IQ4), on CPU only"
        var M = x.dim_size(0)
        var H = x.dim_size(1)
        var I = wg.dim_size(0)
        if H % block_values[qg]() != 0 or H % block_values[qu]() != 0 or I % block_values[qd]() != 0:
            raise Error("crucible.mlp[", qg, ",", qu, ",", qd, "]: H=", H, " or I=", I, " is not a multiple of the block sizes")
        if (wu.dim_size(0) != I or wd.dim_size(0) != H or wg.dim_size(1) != row_bytes_of[qg](H)
                or wu.dim_size(1) != row_bytes_of[qu](H) or wd.dim_size(1) != row_bytes_of[qd](I)):
            raise Error("crucible.mlp[", qg, ",", qu, ",", qd, "]: weight bytes [", I, ",", wg.dim_size(1), "], [",
                        wu.dim_size(0), ",", wu.dim_size(1), "] and [", wd.dim_size(0), ",", wd.dim_size(1),
                        "] do not hold gate, up [I, H=", H, "] and down [H, I] blocks")
        if y.dim_size(0) != M or y.dim_size(1) != H:
            raise Error("crucible.mlp: y is [", y.dim_size(0), ",", y.dim_size(1), "], not [M=", M, ", H=", H, "]")
        if I == 0:
            raise Error("crucible.mlp: the weights have no intermediate rows (I = 0)")
        if M == 0 or H == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.mlp on CPU computes in float32"
            mlp_cpu[qg, qu, qd, act, gate](
                rebind[Ptr[F32]](y.unsafe_ptr()), rebind[Ptr[F32]](x.unsafe_ptr()), rebind[BytePtr](wg.unsafe_ptr()),
                rebind[BytePtr](wu.unsafe_ptr()), rebind[BytePtr](wd.unsafe_ptr()), M, H, I, ctx,
            )
        else:
            # h: [M, I], released in stream order after down's kernel is enqueued.
            var hb = ctx.enqueue_create_buffer[y.dtype](M * I)
            var hp = rebind[Ptr[y.dtype]](hb.unsafe_ptr())
            qmatmul2_gpu[y.dtype, qg, qu, gate](
                hp, x.unsafe_ptr(), rebind[BytePtr](wg.unsafe_ptr()), rebind[BytePtr](wu.unsafe_ptr()), M, I, I, H, ctx)
            qmatmul_gpu[y.dtype, qd, "auto"](y.unsafe_ptr(), hp, rebind[BytePtr](wd.unsafe_ptr()), M, H, I, ctx, H)
            _ = hb^
