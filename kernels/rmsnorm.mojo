# crucible.rmsnorm: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w, the Llama norm.
#
# Parameters:
#   eps  epsilon inside the square root (the model's rms_norm_eps)
# The sum of squares is accumulated in fp32 on both targets. CPU: one row per task, SIMD over H.
# GPU: one block of 256 threads per row, block-wide sum.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu import block_idx, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.primitives.block import sum as block_sum
from std.math import sqrt

from .common import F32, FW, Ptr, ceil_div, cpu_threads, parallel_for


@always_inline
def _rms_row_cpu(y: Ptr[F32], x: Ptr[F32], w: Ptr[F32], H: Int, eps: Float32):
    var acc = SIMD[F32, FW](0)
    var i = 0
    while i + FW <= H:
        var v = x.unsafe_load[width=FW](i)
        acc = v.fma(v, acc)
        i += FW
    var ss = acc.reduce_add()
    for j in range(i, H):
        ss += x[unsafe_offset=j] * x[unsafe_offset=j]
    var inv = 1.0 / sqrt(ss / Float32(H) + eps)
    i = 0
    while i + FW <= H:
        y.unsafe_store(i, x.unsafe_load[width=FW](i) * inv * w.unsafe_load[width=FW](i))
        i += FW
    for j in range(i, H):
        y[unsafe_offset=j] = x[unsafe_offset=j] * inv * w[unsafe_offset=j]


def _rms_kernel[dtype: DType](y: Ptr[dtype], x: Ptr[dtype], w: Ptr[dtype], H: Int32, eps: Float32):
    var row = Int(block_idx.x)
    var h = Int(H)
    var tid = Int(thread_idx.x)
    var ss = Float32(0)
    var i = tid
    while i < h:
        var v = x[unsafe_offset=row * h + i].cast[F32]()
        ss += v * v
        i += 256
    var total = block_sum[block_size=256, broadcast=True](ss)
    var inv = 1.0 / sqrt(total / Float32(h) + eps)
    i = tid
    while i < h:
        var v = x[unsafe_offset=row * h + i].cast[F32]() * inv * w[unsafe_offset=i].cast[F32]()
        y[unsafe_offset=row * h + i] = v.cast[dtype]()
        i += 256


@extensibility.register("crucible.rmsnorm")
struct RMSNorm:
    @staticmethod
    def execute[target: StaticString, eps: Float32](
        y: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=y.dtype, rank=2, ...],
        w: InputTensor[dtype=y.dtype, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var T = x.dim_size(0)
        var H = x.dim_size(1)
        if w.dim_size(0) != H:
            raise Error("crucible.rmsnorm: weight has ", w.dim_size(0), " elements, rows have ", H)
        if T == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.rmsnorm on CPU computes in float32"
            var yp = rebind[Ptr[F32]](y.unsafe_ptr())
            var xp = rebind[Ptr[F32]](x.unsafe_ptr())
            var wp = rebind[Ptr[F32]](w.unsafe_ptr())
            # Rows are cheap (H adds): only prefill-sized batches are worth the thread hand-off.
            var tasks = 1 if T * H < 65536 else cpu_threads()
            var per = ceil_div(T, tasks)

            def rows(t: Int) {var yp, var xp, var wp, var T, var H, var per}:
                for r in range(t * per, min(T, (t + 1) * per)):
                    _rms_row_cpu(yp.unsafe_offset(r * H), xp.unsafe_offset(r * H), wp, H, eps)

            if tasks == 1:
                rows(0)
            else:
                parallel_for(rows, tasks, ctx)
        else:
            ctx.enqueue_function[_rms_kernel[y.dtype]](
                y.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(), Int32(H), eps, grid_dim=T, block_dim=256
            )
