# crucible.silu_mul: y[t, i] = act(g[t, i]) * u[t, i] where gate_up[t, :] = [g | u] (a fused gate/up
# projection, one matmul for both halves): the gated MLP activation, computed in fp32.
# Variants (compile-time `act`):
#   "silu":      g / (1 + exp(-g)), Llama/Qwen's SwiGLU.
#   "gelu_tanh": 0.5 g (1 + tanh(z)), z = sqrt(2/pi) (g + 0.044715 g^3), Gemma's GeGLU
#                (transformers' gelu_pytorch_tanh). Written as g / (1 + exp(-2z)), the same function
#                (0.5 (1 + tanh z) = sigmoid(2z)), so both variants share one exp and no cancellation.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu import global_idx
from max.gpu.host import DeviceContext
from std.math import exp

from .common import F32, FW, Ptr, ceil_div, cpu_threads, parallel_for


@always_inline
def gated_act[act: StaticString, W: Int](g: SIMD[F32, W], u: SIMD[F32, W]) -> SIMD[F32, W]:
    comptime if act == "gelu_tanh":
        var z2 = 1.5957691216057308 * (g + 0.044715 * g * g * g)  # 2 sqrt(2/pi) (g + 0.044715 g^3)
        return g / (1.0 + exp(-z2)) * u
    else:
        comptime assert act == "silu", "crucible.silu_mul: act must be silu or gelu_tanh"
        return g / (1.0 + exp(-g)) * u


def silu_mul_block[act: StaticString](y: Ptr[F32], gu: Ptr[F32], t0: Int, t1: Int, lo: Int, hi: Int, I: Int):
    """y[t, lo:hi] = act(g[t, lo:hi]) * u[t, lo:hi] for rows t0 <= t < t1; gu: [T, 2I] rows [g | u], y: [T, I]."""
    for t in range(t0, t1):
        var g = gu.unsafe_offset(t * 2 * I)
        var u = g.unsafe_offset(I)
        var o = y.unsafe_offset(t * I)
        var i = lo
        while i + FW <= hi:
            o.unsafe_store(i, gated_act[act, FW](g.unsafe_load[width=FW](i), u.unsafe_load[width=FW](i)))
            i += FW
        while i < hi:
            o[unsafe_offset=i] = gated_act[act, 1](g[unsafe_offset=i], u[unsafe_offset=i])
            i += 1


def silu_mul_cpu[act: StaticString](y: Ptr[F32], gu: Ptr[F32], T: Int, I: Int, ctx: DeviceContext) raises:
    """y[T, I] = act(g) * u over gu [T, 2I] = [g | u], split over the cores by rows when it is large."""
    var tasks = 1 if T * I < 65536 else cpu_threads()
    var per = ceil_div(T, tasks)

    def rows(task: Int) {var y, var gu, var T, var I, var per}:
        silu_mul_block[act](y, gu, task * per, min(T, (task + 1) * per), 0, I, I)

    if tasks == 1:
        rows(0)
    else:
        parallel_for(rows, tasks, ctx)


def silu_mul_kernel[act: StaticString, dtype: DType](y: Ptr[dtype], gu: Ptr[dtype], T: Int32, I: Int32):
    var idx = Int(global_idx.x)
    var width = Int(I)
    if idx >= Int(T) * width:
        return
    var t = idx // width
    var i = idx % width
    var g = gu[unsafe_offset=t * 2 * width + i].cast[F32]()
    var u = gu[unsafe_offset=t * 2 * width + width + i].cast[F32]()
    y[unsafe_offset=idx] = gated_act[act, 1](g, u).cast[dtype]()


@extensibility.register("crucible.silu_mul")
struct SiluMul:
    @staticmethod
    def execute[target: StaticString, act: StaticString = "silu"](
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
            silu_mul_cpu[act](rebind[Ptr[F32]](y.unsafe_ptr()), rebind[Ptr[F32]](gate_up.unsafe_ptr()), T, I, ctx)
        else:
            ctx.enqueue_function[silu_mul_kernel[act, y.dtype]](
                y.unsafe_ptr(), gate_up.unsafe_ptr(), Int32(T), Int32(I),
                grid_dim=ceil_div(T * I, 256), block_dim=256,
            )
