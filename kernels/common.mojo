# Shared helpers for the kernels: pointer aliases, scratch memory, half-precision decode, CPU sizing.

from std.memory import bitcast
from std.memory.alloc import unsafe_alloc
from std.sys.info import num_physical_cores, simd_width_of
from std.atomic import Atomic
from std.ffi import external_call
from max.gpu.host import DeviceContext

from .handoff import run_on_runtime

comptime Ptr[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]
comptime BytePtr = Pointer[UInt8, MutAnyOrigin]
comptime F32 = DType.float32
# SIMD width of float32 on the compile target (16 with AVX-512, 8 with AVX2).
comptime FW = simd_width_of[DType.float32]()


def scratch[dtype: DType](n: Int) -> Ptr[dtype]:
    """Allocates n elements of per-call scratch (freed by the caller with unsafe_free)."""
    return rebind[Ptr[dtype]](unsafe_alloc[Scalar[dtype]](n))


@always_inline
def load_f16_as_f32(p: BytePtr) -> Float32:
    """Reads an IEEE half at an arbitrary (possibly odd) byte address; GGUF block scales are halves."""
    var bits = UInt16(p[unsafe_offset=0]) | (UInt16(p[unsafe_offset=1]) << 8)
    return bitcast[DType.float16, 1](bits).cast[F32]()


def cpu_threads() -> Int:
    """Worker count for CPU kernels: one per physical core (SMT siblings share the FMA units)."""
    return max(1, num_physical_cores())


def ceil_div(a: Int, b: Int) -> Int:
    return (a + b - 1) // b


def parallel_for[FuncType: def(Int) -> None](func: FuncType, n: Int, ctx: DeviceContext):
    """Runs func(0), ..., func(n - 1) on one worker per physical core, handing out items dynamically.

    MAX's `parallelize` splits the items into one fixed chunk per worker. Here each worker takes the
    next item from a shared atomic counter instead: while a graph executes, the calling Python thread
    spin-yields on one of this machine's two cores, so a worker that gets descheduled falls behind,
    and fixed chunks would leave the other core idle at the end.

    The hand-off itself has a fixed cost per call (`crucible.overhead_probe`, printed by the kernel
    benchmark); handoff.run_on_runtime keeps it small. `ctx` is unused on the CPU: the bodies go to
    the runtime that runs the calling worker.
    """
    def item(p: Int, i: Int) {imm func}:
        func(i)

    parallel_phases(item, n, 1, ctx)


# Spins on a phase boundary between sched_yield calls: far longer than a balanced boundary waits
# (0.2-0.35 us measured), short against a scheduler tick.
comptime PHASE_SPINS_BEFORE_YIELD = 4096


def parallel_phases[FuncType: def(Int, Int) -> None](func: FuncType, n: Int, phases: Int, ctx: DeviceContext):
    """Runs func(p, i) for every phase p < phases and item i < n in one hand-off to the cores; no item
    of phase p + 1 starts before every item of phase p has finished.

    Why: the hand-off of parallel_for is a fixed cost per op, many times a phase boundary's (the kernel
    benchmark's op_overhead prints both), so work that would be several parallel ops in a row can be
    one op with several phases. Items are claimed from a per-phase counter, as in parallel_for, and a
    worker waits at a boundary only for items another worker has claimed and is running: if a worker
    never starts, the others take all its items, so a phase cannot wait on work nobody runs.
    """
    if n <= 0 or phases <= 0:
        return
    var workers = min(n, cpu_threads())
    if workers == 1:
        for p in range(phases):
            for i in range(n):
                func(p, i)
        return
    # state[2 p]: items of phase p claimed; state[2 p + 1]: items of phase p finished.
    var state = scratch[DType.int64](2 * phases)
    for j in range(2 * phases):
        state[unsafe_offset=j] = 0

    def worker(w: Int) {imm func, var state, var n, var phases}:
        for p in range(phases):
            var claimed = state.unsafe_offset(2 * p)
            var finished = state.unsafe_offset(2 * p + 1)
            while True:
                var i = Int(Atomic.fetch_add(claimed, 1))
                if i >= n:
                    break
                func(p, i)
                if p + 1 < phases:  # nobody waits on the last phase's count: run_on_runtime joins
                    _ = Atomic.fetch_add(finished, 1)
            if p + 1 < phases:
                var spins = 0
                while Int(Atomic.load(finished)) < n:
                    # A worker preempted inside its item needs a core: give this one up now and then.
                    spins += 1
                    if spins == PHASE_SPINS_BEFORE_YIELD:
                        _ = external_call["sched_yield", Int32]()
                        spins = 0

    run_on_runtime(worker, workers)
    state.unsafe_free()

