# crucible.silu_mul: y[t, i] = silu(g[t, i]) * u[t, i] where gate_up[t, :] = [g | u] (a fused gate/up
# projection, one matmul for both halves), the gated MLP activation of Llama.
# silu(g) = g / (1 + exp(-g)), computed in fp32.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu import global_idx
from max.gpu.host import DeviceContext
from std.math import exp

from .common import F32, FW, Ptr, ceil_div, cpu_threads, parallel_for


@always_inline
def _silu_mul[W: Int](g: SIMD[F32, W], u: SIMD[F32, W]) -> SIMD[F32, W]:
    return g / (1.0 + exp(-g)) * u


def _silu_mul_kernel[dtype: DType](y: Ptr[dtype], gu: Ptr[dtype], T: Int32, I: Int32):
    var idx = Int(global_idx.x)
    var width = Int(I)
    if idx >= Int(T) * width:
        return
    var t = idx // width
    var i = idx % width
    var g = gu[unsafe_offset=t * 2 * width + i].cast[F32]()
    var u = gu[unsafe_offset=t * 2 * width + width + i].cast[F32]()
    y[unsafe_offset=idx] = _silu_mul[1](g, u).cast[dtype]()


@extensibility.register("crucible.silu_mul")
struct SiluMul:
    @staticmethod
    def execute[target: StaticString](
        y: OutputTensor[rank=2, ...],
        gate_up: InputTensor[dtype=y.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var T = gate_up.dim_size(0)
        var I = y.dim_size(1)
        if gate_up.dim_size(1) != 2 * I or y.dim_size(0) != T:
            raise Error("crucible.silu_mul: gate_up must be [T, 2I] for y [T, I]; got [", T, ",",
                        gate_up.dim_size(1), "] and [", y.dim_size(0), ",", I, "]")
        if T == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.silu_mul on CPU computes in float32"
            var yp = rebind[Ptr[F32]](y.unsafe_ptr())
            var gp = rebind[Ptr[F32]](gate_up.unsafe_ptr())
            var tasks = 1 if T * I < 65536 else cpu_threads()
            var per = ceil_div(T, tasks)

            def rows(task: Int) {var yp, var gp, var T, var I, var per}:
                for t in range(task * per, min(T, (task + 1) * per)):
                    var g = gp.unsafe_offset(t * 2 * I)
                    var u = g.unsafe_offset(I)
                    var o = yp.unsafe_offset(t * I)
                    var i = 0
                    while i + FW <= I:
                        o.unsafe_store(i, _silu_mul(g.unsafe_load[width=FW](i), u.unsafe_load[width=FW](i)))
                        i += FW
                    while i < I:
                        o[unsafe_offset=i] = _silu_mul[1](g[unsafe_offset=i], u[unsafe_offset=i])
                        i += 1

            if tasks == 1:
                rows(0)
            else:
                parallel_for(rows, tasks, ctx)
        else:
            ctx.enqueue_function[_silu_mul_kernel[y.dtype]](
                y.unsafe_ptr(), gate_up.unsafe_ptr(), Int32(T), Int32(I),
                grid_dim=ceil_div(T * I, 256), block_dim=256,
            )
