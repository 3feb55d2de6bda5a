# CPU fp32 matmul: y[M, N] = x[M, K] @ W[N, K]^T, W in the nn.Linear layout.
#
# Two algorithms, chosen by the op's `variant` parameter ("auto" picks by M):
#   gemv  M <= 8 (decode): memory-bound, streams each weight row once (gemv_cpu.mojo).
#   gemm  M > 8 (prefill): compute-bound, BLIS-style blocking (gemm_cpu.mojo).

from max.gpu.host import DeviceContext

from .common import BytePtr, F32, Ptr
from .gemm_cpu import gemm_cpu
from .gemv_cpu import GEMV_MAX_M, gemv_cpu


def matmul_cpu[variant: StaticString](
    y: Ptr[F32], x: Ptr[F32], w: Ptr[F32], M: Int, N: Int, K: Int, ctx: DeviceContext
) raises:
    """Dispatches on the variant: "auto" (gemv for M <= 8, else gemm), "gemv" or "gemm"."""
    comptime if variant == "gemm":
        gemm_cpu["f32"](y, x, rebind[BytePtr](w), K * 4, M, N, K, ctx, N)
    elif variant == "gemv":
        gemv_cpu(y, x, w, M, N, K, ctx)
    elif variant == "auto":
        if M <= GEMV_MAX_M:
            gemv_cpu(y, x, w, M, N, K, ctx)
        else:
            gemm_cpu["f32"](y, x, rebind[BytePtr](w), K * 4, M, N, K, ctx, N)
    else:
        comptime assert False, "crucible.matmul on CPU: variant must be auto, gemv or gemm"
