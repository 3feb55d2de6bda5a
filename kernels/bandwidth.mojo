# crucible.read_bandwidth: sums a float32 vector with plain vector loads, in 4 MB chunks over the cores
# (CPU) or in 16-byte vectors per thread (GPU).
# The benchmark times it on a buffer several times the last-level cache to measure the machine's read
# bandwidth in the same run as the kernels, the ceiling for memory-bound rows (GEMV, qmatmul, decode
# attention). The sum is returned so the loads cannot be elided.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu import block_idx, thread_idx
from max.gpu.host import DeviceBuffer, DeviceContext
from max.gpu.primitives.block import sum as block_sum
from std.atomic import Atomic

from .common import F32, FW, Ptr, ceil_div, parallel_for, scratch


def _sum_kernel(result: Ptr[F32], x: Ptr[F32], n: Int64):
    # Each block of 1024 threads sums 64K elements in 16-byte vectors (coalesced: consecutive threads
    # read consecutive vectors) and adds its total atomically. x's base is 16-byte aligned (launch).
    var tid = Int(thread_idx.x)
    var base = Int(block_idx.x) * 65536
    var acc = SIMD[F32, 4](0)
    for i in range(16):
        var idx = base + (i * 1024 + tid) * 4
        if idx + 4 <= Int(n):
            acc += x.unsafe_offset(idx).unsafe_load[width=4, alignment=16](0)
        else:
            for j in range(4):
                if idx + j < Int(n):
                    acc[j] += x[unsafe_offset=idx + j]
    var total = block_sum[block_size=1024, broadcast=False](acc.reduce_add())
    if tid == 0:
        _ = Atomic.fetch_add(result, total)


def read_sum_cpu(xp: Ptr[F32], n: Int, ctx: DeviceContext) raises -> Float32:
    """Sums x[0 .. n) on all cores with plain vector loads (also timed by benchmarks/profile_attention.mojo)."""
    # Chunks of 1M floats (4 MB, long sequential streams) handed out dynamically: with one fixed
    # half per core, a core that started late or was preempted set the time, and the probe read
    # less than the fp32 GEMV did.
    var tasks = max(1, ceil_div(n, 1 << 20))
    var per = ceil_div(ceil_div(n, tasks), 4 * FW) * 4 * FW
    var partial = scratch[F32](tasks)

    def work(t: Int) {var xp, var partial, var per, var n}:
        var a0 = SIMD[F32, FW](0)
        var a1 = SIMD[F32, FW](0)
        var a2 = SIMD[F32, FW](0)
        var a3 = SIMD[F32, FW](0)
        var i = t * per
        var end = min(n, i + per)
        while i + 4 * FW <= end:
            a0 += xp.unsafe_load[width=FW](i)
            a1 += xp.unsafe_load[width=FW](i + FW)
            a2 += xp.unsafe_load[width=FW](i + 2 * FW)
            a3 += xp.unsafe_load[width=FW](i + 3 * FW)
            i += 4 * FW
        var s = (a0 + a1 + a2 + a3).reduce_add()
        while i < end:
            s += xp[unsafe_offset=i]
            i += 1
        partial[unsafe_offset=t] = s

    parallel_for(work, tasks, ctx)
    var total = Float32(0)
    for t in range(tasks):
        total += partial[unsafe_offset=t]
    partial.unsafe_free()
    return total


@extensibility.register("crucible.read_bandwidth")
struct ReadBandwidth:
    @staticmethod
    def execute[target: StaticString](
        result: OutputTensor[dtype=F32, rank=1, ...],
        x: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var n = x.dim_size(0)
        var xp = rebind[Ptr[F32]](x.unsafe_ptr())
        var op = rebind[Ptr[F32]](result.unsafe_ptr())
        comptime if target == "cpu":
            op[unsafe_offset=0] = read_sum_cpu(xp, n, ctx)
        else:
            if Int(xp) % 16 != 0:
                raise Error("crucible.read_bandwidth on GPU: x must start 16-byte aligned")
            ctx.enqueue_memset(DeviceBuffer[F32](ctx, op, 1, owning=False), 0)
            ctx.enqueue_function[_sum_kernel](op, xp, Int64(n), grid_dim=ceil_div(n, 65536), block_dim=1024)
