# crucible.rmsnorm: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w, the Llama norm.
# crucible.add_rmsnorm: the residual add before it in one op: s = h + delta, y = rmsnorm(s) * w,
#   both s (the new residual stream) and y returned. A Llama layer adds a branch to the residual stream
#   right before each norm; as two graph ops that is one more kernel launch per norm (two per layer
#   and decode step), and the sum is written and read back once more.
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
    _rms_scale_row_cpu(y, x, w, H, ss, eps)


@always_inline
def _add_rms_row_cpu(s: Ptr[F32], y: Ptr[F32], h: Ptr[F32], d: Ptr[F32], w: Ptr[F32], H: Int, eps: Float32):
    # s = h + d (stored), then y = rmsnorm(s) * w reading s back from L1.
    var acc = SIMD[F32, FW](0)
    var i = 0
    while i + FW <= H:
        var v = h.unsafe_load[width=FW](i) + d.unsafe_load[width=FW](i)
        s.unsafe_store(i, v)
        acc = v.fma(v, acc)
        i += FW
    var ss = acc.reduce_add()
    for j in range(i, H):
        var v = h[unsafe_offset=j] + d[unsafe_offset=j]
        s[unsafe_offset=j] = v
        ss += v * v
    _rms_scale_row_cpu(y, s, w, H, ss, eps)


@always_inline
def _rms_scale_row_cpu(y: Ptr[F32], x: Ptr[F32], w: Ptr[F32], H: Int, ss: Float32, eps: Float32):
    # y = x / sqrt(ss / H + eps) * w, ss the row's sum of squares.
    var inv = 1.0 / sqrt(ss / Float32(H) + eps)
    var i = 0
    while i + FW <= H:
        y.unsafe_store(i, x.unsafe_load[width=FW](i) * inv * w.unsafe_load[width=FW](i))
        i += FW
    for j in range(i, H):
        y[unsafe_offset=j] = x[unsafe_offset=j] * inv * w[unsafe_offset=j]


def _rms_kernel[dtype: DType, add: Bool](
    y: Ptr[dtype], s: Ptr[dtype], x: Ptr[dtype], delta: Ptr[dtype], w: Ptr[dtype], H: Int32, eps: Float32
):
    # add: s = x + delta first (stored in dtype, as the unfused graph's add would), then the norm of s.
    # Each thread reads back only the elements it stored itself, so no barrier is needed before that.
    var row = Int(block_idx.x)
    var h = Int(H)
    var tid = Int(thread_idx.x)
    var ss = Float32(0)
    var i = tid
    while i < h:
        comptime if add:
            var sum = (x[unsafe_offset=row * h + i].cast[F32]() + delta[unsafe_offset=row * h + i].cast[F32]()).cast[dtype]()
            s[unsafe_offset=row * h + i] = sum
            var v = sum.cast[F32]()
            ss += v * v
        else:
            var v = x[unsafe_offset=row * h + i].cast[F32]()
            ss += v * v
        i += 256
    var src = s if add else x
    var total = block_sum[block_size=256, broadcast=True](ss)
    var inv = 1.0 / sqrt(total / Float32(h) + eps)
    i = tid
    while i < h:
        var v = src[unsafe_offset=row * h + i].cast[F32]() * inv * w[unsafe_offset=i].cast[F32]()
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
            ctx.enqueue_function[_rms_kernel[y.dtype, False]](
                y.unsafe_ptr(), y.unsafe_ptr(), x.unsafe_ptr(), x.unsafe_ptr(), w.unsafe_ptr(), Int32(H), eps,
                grid_dim=T, block_dim=256,
            )


@extensibility.register("crucible.add_rmsnorm")
struct AddRMSNorm:
    @staticmethod
    def execute[target: StaticString, eps: Float32](
        s: OutputTensor[rank=2, ...],
        y: OutputTensor[dtype=s.dtype, rank=2, ...],
        h: InputTensor[dtype=s.dtype, rank=2, ...],
        delta: InputTensor[dtype=s.dtype, rank=2, ...],
        w: InputTensor[dtype=s.dtype, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        # s, y, h, delta: [T, H]; w: [H].
        var T = h.dim_size(0)
        var H = h.dim_size(1)
        if delta.dim_size(0) != T or delta.dim_size(1) != H:
            raise Error("crucible.add_rmsnorm: delta is [", delta.dim_size(0), ", ", delta.dim_size(1),
                        "], the residual [", T, ", ", H, "]")
        if w.dim_size(0) != H:
            raise Error("crucible.add_rmsnorm: weight has ", w.dim_size(0), " elements, rows have ", H)
        if T == 0:
            return
        comptime if target == "cpu":
            comptime assert s.dtype == F32, "crucible.add_rmsnorm on CPU computes in float32"
            var sp = rebind[Ptr[F32]](s.unsafe_ptr())
            var yp = rebind[Ptr[F32]](y.unsafe_ptr())
            var hp = rebind[Ptr[F32]](h.unsafe_ptr())
            var dp = rebind[Ptr[F32]](delta.unsafe_ptr())
            var wp = rebind[Ptr[F32]](w.unsafe_ptr())
            var tasks = 1 if T * H < 65536 else cpu_threads()
            var per = ceil_div(T, tasks)

            def rows(t: Int) {var sp, var yp, var hp, var dp, var wp, var T, var H, var per}:
                for r in range(t * per, min(T, (t + 1) * per)):
                    _add_rms_row_cpu(sp.unsafe_offset(r * H), yp.unsafe_offset(r * H), hp.unsafe_offset(r * H),
                                     dp.unsafe_offset(r * H), wp, H, eps)

            if tasks == 1:
                rows(0)
            else:
                parallel_for(rows, tasks, ctx)
        else:
            ctx.enqueue_function[_rms_kernel[s.dtype, True]](
                y.unsafe_ptr(), s.unsafe_ptr(), h.unsafe_ptr(), delta.unsafe_ptr(), w.unsafe_ptr(), Int32(H), eps,
                grid_dim=T, block_dim=256,
            )
