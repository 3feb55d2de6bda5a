# crucible.qmatmul: y[M, N] = x[M, K] @ dequant(Wq)^T with Wq [N, K / 32 * block_bytes] uint8 holding
# GGUF blocks byte for byte, so tensors from a GGUF file feed it without conversion.
#
# Parameters:
#   qtype  "q4_0" | "q4_1" | "q8_0" | "f16"   (block layouts in quant.mojo)
#   act    "f32" (default): x is used as float32 everywhere; exact up to float rounding.
#          "q8": CPU decode path (M <= 32) quantizes x to int8 per 32-value block and runs integer
#          block dot products (qdot_int8.mojo), as llama.cpp does: faster, with its own error bound.
#          Block formats only, CPU only; prefill (M > 32) stays float32.
# CPU: qgemv for M <= 32, decode-into-panel GEMM above (qmatmul_cpu.mojo). GPU: qmatmul_gpu.mojo.
# x and y are float32 on CPU; on GPU they may be float32 or bfloat16 (accumulation is fp32).

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .common import BytePtr, F32, Ptr
from .qmatmul_cpu import qmatmul_cpu
from .qmatmul_gpu import qmatmul_gpu
from .quant import QBLOCK, block_bytes


@extensibility.register("crucible.qmatmul")
struct QMatmul:
    @staticmethod
    def execute[target: StaticString, qtype: StaticString, act: StaticString = "f32"](
        y: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=y.dtype, rank=2, ...],
        w: InputTensor[dtype=DType.uint8, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = w.dim_size(0)
        if K % QBLOCK != 0:
            raise Error("crucible.qmatmul: K=", K, " is not a multiple of the block size 32")
        if w.dim_size(1) != (K // QBLOCK) * block_bytes[qtype]() or y.dim_size(0) != M or y.dim_size(1) != N:
            raise Error("crucible.qmatmul[", qtype, "]: weight bytes [", N, ",", w.dim_size(1),
                        "] do not hold [N, K=", K, "] blocks, or y is not [", M, ",", N, "]")
        comptime assert act == "f32" or act == "q8", "crucible.qmatmul: act is f32 or q8"
        comptime assert act == "f32" or (qtype != "f16" and target == "cpu"), "act=q8: block formats on CPU only"
        if M == 0 or N == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.qmatmul on CPU computes in float32"
            qmatmul_cpu[qtype, act](
                rebind[Ptr[F32]](y.unsafe_ptr()), rebind[Ptr[F32]](x.unsafe_ptr()),
                rebind[BytePtr](w.unsafe_ptr()), M, N, K, ctx,
            )
        else:
            qmatmul_gpu[y.dtype, qtype](y.unsafe_ptr(), x.unsafe_ptr(), rebind[BytePtr](w.unsafe_ptr()), M, N, K, ctx)
