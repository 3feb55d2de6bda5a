# crucible.qmatmul: y[M, N] = x[M, K] @ dequant(Wq)^T with Wq [N, K / 32 * block_bytes] uint8 holding
# GGUF blocks byte for byte, so tensors from a GGUF file feed it without conversion.
#
# Parameters:
#   qtype  "q4_0" | "q4_1" | "q5_0" | "q5_1" | "q8_0" | "q2_k" | "q3_k" | "q4_k" | "q5_k" | "q6_k" |
#          "iq4_nl" | "iq4_xs" | "f16" | "bf16"   (block layouts in quant.mojo, quant_k.mojo and
#          quant_iq.mojo). Every format decodes 32
#          values at a time into registers, so all of them share the row, GEMM-panel and GPU loops;
#          Q4_0 / Q4_1 / Q8_0 add the batch-1 integer rows that llama.cpp's common formats needed.
#   act    "f32" (default): x is used as float32 everywhere; exact up to float rounding.
#          "q8": CPU decode path (M <= 32) quantizes x to int8 per 32-value block and runs integer
#          block dot products (qdot_int8.mojo), as llama.cpp does: faster, with its own error bound.
#          Every linear block format (the K-quants in qgemv_ksuper_q8.mojo), not F16 / BF16 nor
#          IQ4_NL / IQ4_XS (whose levels are not d * q); CPU only;
#          prefill (M > 32) stays float32.
#   variant GPU: "auto" | "lanes" | "staged" (qmatmul_gpu.mojo: how a warp reads its row); CPU: "auto".
# CPU: qgemv for M <= 32, decode-into-panel GEMM above (qmatmul_cpu.mojo). GPU: qmatmul_gpu.mojo.
# x and y are float32 on CPU; on GPU they may be float32 or bfloat16 (accumulation is fp32).

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .common import BytePtr, F32, Ptr
from .qmatmul_cpu import qmatmul_cpu
from .qmatmul_gpu import qmatmul_gpu
from .quant import block_values, has_q8_rows, row_bytes_of


@extensibility.register("crucible.qmatmul")
struct QMatmul:
    @staticmethod
    def execute[target: StaticString, qtype: StaticString, act: StaticString = "f32", variant: StaticString = "auto"](
        y: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=y.dtype, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = w.dim_size(0)
        if K % block_values[qtype]() != 0:
            raise Error("crucible.qmatmul[", qtype, "]: K=", K, " is not a multiple of the block size ", block_values[qtype]())
        if w.dim_size(1) != row_bytes_of[qtype](K) or y.dim_size(0) != M or y.dim_size(1) != N:
            raise Error("crucible.qmatmul[", qtype, "]: weight bytes [", N, ",", w.dim_size(1),
                        "] do not hold [N, K=", K, "] blocks, or y is not [", M, ",", N, "]")
        comptime assert act == "f32" or act == "q8", "crucible.qmatmul: act is f32 or q8"
        comptime assert act == "f32" or (has_q8_rows[qtype]() and target == "cpu"), (
            "act=q8: the linear GGUF block formats (not F16 / BF16 / IQ4), on CPU only"
        )
        comptime assert variant == "auto" or target != "cpu", "crucible.qmatmul on CPU: variant is auto"
        if M == 0 or N == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.qmatmul on CPU computes in float32"
            qmatmul_cpu[qtype, act](
                rebind[Ptr[F32]](y.unsafe_ptr()), rebind[Ptr[F32]](x.unsafe_ptr()),
                rebind[BytePtr](w.unsafe_ptr()), M, N, K, ctx, N,
            )
        else:
            qmatmul_gpu[y.dtype, qtype, variant](
                y.unsafe_ptr(), x.unsafe_ptr(), rebind[BytePtr](w.unsafe_ptr()), M, N, K, ctx, N)
