# crucible.matmul: y[M, N] = x[M, K] @ W[N, K]^T (weights in the nn.Linear layout).
#
# Parameters:
#   variant  CPU: "auto" | "gemv" | "gemm"   (matmul_cpu.mojo; auto = gemv for M <= 8)
#            GPU: "auto" | "tiled" | "tensor_core" | "tensor_core_vec" | "gemv"   (matmul_gpu.mojo;
#                 auto = gemv for M <= 8, else tensor_core for bf16/fp16 on NVIDIA, tiled otherwise)
# CPU computes in fp32 (MAX runs CPU graphs in float32); GPU takes fp32, bf16 or fp16 with fp32
# accumulation. Tests force each variant so every path stays covered.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu.host import DeviceContext

from .common import F32, Ptr
from .matmul_cpu import matmul_cpu
from .matmul_gpu import matmul_gpu


@extensibility.register("crucible.matmul")
struct Matmul:
    @staticmethod
    def execute[target: StaticString, variant: StaticString = "auto"](
        y: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=y.dtype, rank=2, ...],
        w: InputTensor[dtype=y.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var M = x.dim_size(0)
        var K = x.dim_size(1)
        var N = w.dim_size(0)
        if w.dim_size(1) != K or y.dim_size(0) != M or y.dim_size(1) != N:
            raise Error("crucible.matmul: shapes x[", M, ",", K, "] W[", N, ",", w.dim_size(1),
                        "] y[", y.dim_size(0), ",", y.dim_size(1), "] do not fit y = x @ W^T")
        if M == 0 or N == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.matmul on CPU computes in float32"
            matmul_cpu[variant](
                rebind[Ptr[F32]](y.unsafe_ptr()), rebind[Ptr[F32]](x.unsafe_ptr()),
                rebind[Ptr[F32]](w.unsafe_ptr()), M, N, K, ctx,
            )
        else:
            matmul_gpu[y.dtype, variant](y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(), M, N, K, ctx)
