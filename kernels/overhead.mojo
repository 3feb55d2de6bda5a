# crucible.overhead_probe: y[0] = x[0] + 1 and no other work, so that a chain of these ops in one graph
# times the fixed cost every op pays before it does anything. The kernel benchmark prints it next to
# the read-bandwidth probe: it is the floor under the small decode rows, which pay it on top of their
# reads.
#
# Variant (compile-time parameter `parallel`):
#   False  the body runs on the runtime worker that called the op: MAX's per-op dispatch.
#   True   the body hands one empty item per physical core to common.parallel_for, as every parallel
#          CPU kernel does: dispatch plus the runtime's task hand-off (enqueue, start on every worker,
#          join). On the GPU both variants are one kernel launch; `parallel` launches 132 one-thread
#          blocks (one per SM of an H100/H200) instead of one, so the launch covers the whole device.
# Parameter `phases` (>= 1; with parallel): the hand-off runs `phases` phases of one empty item per
#          core through common.parallel_phases, so one op with P phases against one with 1 times a
#          phase boundary, the cost that fusing P parallel ops into one op pays instead of P - 1
#          hand-offs. On the GPU, one launch per phase.
# Why a probe: timing items from inside an op showed the hand-off's parts (start latency on each
# worker, the return after the last item); this probe measures the total, as a graph sees it.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu import block_idx, thread_idx
from max.gpu.host import DeviceContext

from .common import F32, Ptr, cpu_threads, parallel_phases, scratch


def _add_one_kernel(y: Ptr[F32], x: Ptr[F32]):
    if Int(block_idx.x) == 0 and Int(thread_idx.x) == 0:
        y[unsafe_offset=0] = x[unsafe_offset=0] + 1.0


@extensibility.register("crucible.overhead_probe")
struct OverheadProbe:
    @staticmethod
    def execute[target: StaticString, parallel: Bool, phases: Int](
        y: OutputTensor[dtype=F32, rank=1, ...],
        x: InputTensor[dtype=F32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        # y: [1], x: [1]
        var yp = rebind[Ptr[F32]](y.unsafe_ptr())
        var xp = rebind[Ptr[F32]](x.unsafe_ptr())
        comptime if target == "cpu":
            comptime if parallel:
                var items = cpu_threads()
                var seen = scratch[F32](items * phases)
                for j in range(items * phases):
                    seen[unsafe_offset=j] = 0.0

                def item(p: Int, i: Int) {var seen, var items}:
                    # A phase's mark is 1 only if the previous phase's mark of this item was set.
                    var before = Float32(1.0) if p == 0 else seen[unsafe_offset=(p - 1) * items + i]
                    seen[unsafe_offset=p * items + i] = before

                parallel_phases(item, items, phases, ctx)
                # Every item of every phase must have run, in phase order: the mean of the last
                # phase's marks is the increment.
                var total = Float32(0)
                for i in range(items):
                    total += seen[unsafe_offset=(phases - 1) * items + i]
                seen.unsafe_free()
                yp[unsafe_offset=0] = xp[unsafe_offset=0] + total / Float32(items)
            else:
                yp[unsafe_offset=0] = xp[unsafe_offset=0] + 1.0
        else:
            comptime blocks = 132 if parallel else 1  # one per SM of an H100/H200
            for _ in range(phases):
                ctx.enqueue_function[_add_one_kernel](yp, xp, grid_dim=blocks, block_dim=1)
