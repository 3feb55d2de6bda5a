# crucible.qmatmul2: one op for two projections of the same x over GGUF block weights, each in its own
# format, and what follows them:
#   A = x[M, K] @ dequant(Wa)^T [M, Na],   B = x @ dequant(Wb)^T [M, Nb]
#
# Parameters:
#   qa, qb    each weight's block format (crucible.qmatmul's qtype; the same or not).
#   act       crucible.qmatmul's activation form ("f32" | "q8"), for both weights.
#   epilogue  "cat":       y = [A | B]                [M, Na + Nb]: q|k|v or gate|up stored in two types
#                          (llama.cpp's K-quant presets): one op where two matmuls and a concat ran.
#             "silu":      y = silu(A) * B            [M, Na], Na == Nb: the SwiGLU MLP,
#             "gelu_tanh": y = gelu_tanh(A) * B       Gemma's GeGLU: gate|up and crucible.silu_mul in one.
# Why: a batch-1 decode step is ~270 small ops, and each costs a dispatch and a hand-off to the cores
# (crucible.overhead_probe) besides its work. On CPU, decode (M <= 32) splits the rows of both weights
# in one hand-off: each task runs its share of A's rows and of B's rows (qmatmul_cpu.qgemv_cpu with a
# serial RowSpan), then, for the gated epilogues, act(A) * B on those columns. Prefill runs each GEMM
# and then the epilogue. On GPU each weight is one crucible.qmatmul launch writing its columns (a
# scratch [M, 2Na] for the gated epilogues, then crucible.silu_mul's kernel).
# Every value is computed as crucible.qmatmul (+ crucible.silu_mul) computes it: at M = 1 the result is
# the unfused ops' bit for bit, but for subnormal results, which a worker thread may flush to zero
# (the conformance grid, qmatmul2_checks.py).

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .common import BytePtr, F32, FW, Ptr, ceil_div, parallel_for, scratch
from .qmatmul_cpu import QGEMV_MAX_M, RowSpan, qgemv_cpu, qmatmul_cpu, task_count
from .qmatmul_gpu import qmatmul_gpu
from .quant import block_values, has_q8_rows, row_bytes_of
from .silu_mul import silu_mul_block, silu_mul_cpu, silu_mul_kernel


def qmatmul2_cpu[qa: StaticString, qb: StaticString, act: StaticString, epilogue: StaticString](
    y: Ptr[F32], x: Ptr[F32], wa: BytePtr, wb: BytePtr, M: Int, Na: Int, Nb: Int, K: Int, ctx: DeviceContext
) raises:
    # ab: [M, Na + Nb] = [A | B]: y itself for "cat", else scratch that the epilogue reads.
    comptime cat = epilogue == "cat"
    var ldab = Na + Nb
    var ab = y if cat else scratch[F32](M * ldab)
    if M > QGEMV_MAX_M:
        qmatmul_cpu[qa, act](ab, x, wa, M, Na, K, ctx, ldab)
        qmatmul_cpu[qb, act](ab.unsafe_offset(Na), x, wb, M, Nb, K, ctx, ldab)
        comptime if not cat:
            silu_mul_cpu[epilogue](y, ab, M, Na, ctx)
    else:
        var tasks = task_count(Na * row_bytes_of[qa](K) + Nb * row_bytes_of[qb](K))
        # Shares in whole vectors of columns: the gated epilogue then takes the same vector and scalar
        # steps per column as crucible.silu_mul, and the rows' R-steps pair as in crucible.qmatmul.
        var per_a = ceil_div(ceil_div(Na, tasks), FW) * FW
        var per_b = ceil_div(ceil_div(Nb, tasks), FW) * FW

        def task(t: Int) {var y, var ab, var x, var wa, var wb, var M, var Na, var Nb, var K, var ldab,
                                 var per_a, var per_b, var ctx}:
            var a_lo = min(Na, t * per_a)
            var a_hi = min(Na, a_lo + per_a)
            var b_lo = min(Nb, t * per_b)
            var b_hi = min(Nb, b_lo + per_b)
            if a_lo < a_hi:
                qgemv_cpu[qa, act](ab, x, wa, M, K, RowSpan(a_lo, a_hi, ldab, True), ctx)
            if b_lo < b_hi:
                qgemv_cpu[qb, act](ab.unsafe_offset(Na), x, wb, M, K, RowSpan(b_lo, b_hi, ldab, True), ctx)
            comptime if not cat:
                silu_mul_block[epilogue](y, ab, 0, M, a_lo, a_hi, Na)  # Na == Nb: B's columns are A's

        if tasks == 1:
            task(0)
        else:
            parallel_for(task, tasks, ctx)
    comptime if not cat:
        ab.unsafe_free()


def qmatmul2_gpu[dtype: DType, qa: StaticString, qb: StaticString, epilogue: StaticString](
    y: Ptr[dtype], x: Ptr[dtype], wa: BytePtr, wb: BytePtr, M: Int, Na: Int, Nb: Int, K: Int, ctx: DeviceContext
) raises:
    comptime if epilogue == "cat":
        qmatmul_gpu[dtype, qa, "auto"](y, x, wa, M, Na, K, ctx, Na + Nb)
        qmatmul_gpu[dtype, qb, "auto"](y.unsafe_offset(Na), x, wb, M, Nb, K, ctx, Na + Nb)
    else:
        # ab: [M, 2 Na] = [A | B], released in stream order after the epilogue's kernel is enqueued.
        var ab = ctx.enqueue_create_buffer[dtype](M * 2 * Na)
        var abp = rebind[Ptr[dtype]](ab.unsafe_ptr())
        qmatmul_gpu[dtype, qa, "auto"](abp, x, wa, M, Na, K, ctx, 2 * Na)
        qmatmul_gpu[dtype, qb, "auto"](abp.unsafe_offset(Na), x, wb, M, Nb, K, ctx, 2 * Na)
        ctx.enqueue_function[silu_mul_kernel[epilogue, dtype]](
            y, abp, Int32(M), Int32(Na), grid_dim=ceil_div(M * Na, 256), block_dim=256,
        )
        _ = ab^


@extensibility.register("crucible.qmatmul2")
struct QMatmul2:
    @staticmethod
    def execute[target: StaticString, qa: StaticString, qb: StaticString, act: StaticString = "f32",
                epilogue: StaticString = "cat"](
        y: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=y.dtype, rank=2, ...],
        wa: InputTensor[dtype=DType.uint8, rank=2, ...],
        wb: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime cat = epilogue == "cat"
        comptime assert cat or epilogue == "silu" or epilogue == "gelu_tanh", (
            "crucible.qmatmul2: epilogue is cat, silu or gelu_tanh"
        )
        comptime assert act == "f32" or act == "q8", "crucible.qmatmul2: act is f32 or q8"
        comptime assert act == "f32" or (has_q8_rows[qa]() and has_q8_rows[qb]() and target == "cpu"), (
            "act=q8: the linear GGUF block formats (not F16 / BF16 / IQ4), on CPU only"
        )
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var Na = wa.dim_size(0)
        var Nb = wb.dim_size(0)
        if K % block_values[qa]() != 0 or K % block_values[qb]() != 0:
            raise Error("crucible.qmatmul2[", qa, ",", qb, "]: K=", K, " is not a multiple of both block sizes")
        if wa.dim_size(1) != row_bytes_of[qa](K) or wb.dim_size(1) != row_bytes_of[qb](K):
            raise Error("crucible.qmatmul2[", qa, ",", qb, "]: weight bytes [", Na, ",", wa.dim_size(1), "] and [",
                        Nb, ",", wb.dim_size(1), "] do not hold [N, K=", K, "] blocks")
        var ny = Na + Nb if cat else Na
        if (not cat and Na != Nb) or y.dim_size(0) != M or y.dim_size(1) != ny:
            raise Error("crucible.qmatmul2[", epilogue, "]: y is [", y.dim_size(0), ",", y.dim_size(1),
                        "], not [M=", M, ", ", ny, "] for weights of ", Na, " and ", Nb, " rows")
        if M == 0 or ny == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.qmatmul2 on CPU computes in float32"
            qmatmul2_cpu[qa, qb, act, epilogue](
                rebind[Ptr[F32]](y.unsafe_ptr()), rebind[Ptr[F32]](x.unsafe_ptr()), rebind[BytePtr](wa.unsafe_ptr()),
                rebind[BytePtr](wb.unsafe_ptr()), M, Na, Nb, K, ctx,
            )
        else:
            qmatmul2_gpu[y.dtype, qa, qb, epilogue](
                y.unsafe_ptr(), x.unsafe_ptr(), rebind[BytePtr](wa.unsafe_ptr()), rebind[BytePtr](wb.unsafe_ptr()),
                M, Na, Nb, K, ctx,
            )
