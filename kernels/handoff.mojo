# Hands a parallel op's worker bodies straight to MAX's CPU runtime pool (AsyncRT), without the
# DeviceContext stream that `sync_parallelize` goes through.
#
# Why: `sync_parallelize` (`DeviceContext.enqueue_cpu_range` + `synchronize`) costs several times
# more per op than enqueueing on the pool directly, as the stdlib's own task API does, and a decode
# step runs about 150 parallel ops. A pool of our own threads lost: MAX's two runtime workers already
# keep the cores busy. Measurements: benchmarks/results/cpu-2026-12-07d/ and docs/kernels.md.
#
# How, per hand-off: one cell per extra worker, [coroutine handle, done flag, chain]. The body is
# type-erased as a coroutine (as enqueue_cpu_range does) and run by `_run_cell`, a plain callback
# that resumes it, completes the cell's chain, and sets the done flag last. The caller runs worker 0
# itself, then spins on each done flag; a body not finished after WAIT_SPINS spins is waited for on
# its chain, which lets the caller's runtime worker run queued tasks itself (a task nobody has
# started yet, or another graph's), so two ops waiting on each other's queued bodies cannot
# deadlock the pool.

from std.atomic import Atomic
from std.builtin._coroutine import AnyCoroutine, _coro_destroy_fn, _coro_resume_fn
from std.ffi import external_call
from std.memory.alloc import unsafe_alloc
from std.utils.numerics import FlushDenormals

comptime IPtr = Pointer[Int64, MutAnyOrigin]
comptime _OpaquePtr = Pointer[UInt8, MutAnyOrigin]

# Spins on a body's done flag before waiting on its chain: a body the other worker is running ends
# within an item (tens of us at most in decode); one still queued is better run by this worker.
comptime WAIT_SPINS = 1 << 14

# Cell layout (Int64 slots; cells start on 64-byte lines so two workers' flags never share one).
comptime _HANDLE = 0
comptime _DONE = 1
comptime _CHAIN = 2
comptime _CELL = 8


@always_inline
def _cell(cells: IPtr, h: Int) -> IPtr:
    return cells.unsafe_offset(_CELL * h)


def _run_cell(cell: _OpaquePtr):
    """The pool's callback: run the body, complete the chain, then set done (the last touch: after
    it the caller may free the cell, the chain and the coroutine frame)."""
    var c = cell.unsafe_bitcast[Int64]()
    var handle = Int(c[unsafe_offset=_HANDLE])
    _coro_resume_fn(Pointer(to=handle).unsafe_bitcast[AnyCoroutine]()[])
    external_call["KGEN_CompilerRT_AsyncRT_Complete", NoneType](c.unsafe_offset(_CHAIN))
    Atomic.store(c.unsafe_offset(_DONE), 1)


def run_on_runtime[FuncType: def(Int) -> None](func: FuncType, workers: Int):
    """Runs func(0), ..., func(workers - 1): func(0) on the calling thread, the others on MAX's CPU
    runtime pool; returns when all have returned.

    The others usually start at once, but may start late or run on the calling thread after func(0)
    (the chain wait): a body must never wait for another body to start.
    (parallel_phases waits only for items that a running body has claimed.)

    Args:
        func: The worker body; func(w) for each worker w.
        workers: How many workers, at least 1.
    """
    var helpers = workers - 1
    if helpers <= 0:
        with FlushDenormals():
            func(0)
        return
    var block = unsafe_alloc[Int64](_CELL * (helpers + 1))
    var cells = IPtr(unsafe_from_address=(Int(block) + 63) // 64 * 64)

    # Every body runs with subnormals flushed to zero, as sync_parallelize runs its tasks: the
    # numerics stay those of MAX's path, and a subnormal never takes the slow microcode path.
    async def body(w: Int) capturing -> None:
        with FlushDenormals():
            func(w)

    for h in range(helpers):
        var c = _cell(cells, h)
        var coro = body(h + 1)
        coro._set_noop_callback()
        var handle = coro^._take_handle()
        c[unsafe_offset=_HANDLE] = Int64(Pointer(to=handle).unsafe_bitcast[Int]()[])
        c[unsafe_offset=_DONE] = 0
        external_call["KGEN_CompilerRT_AsyncRT_InitializeChain", NoneType](c.unsafe_offset(_CHAIN))
        # worker id -1: whichever runtime worker is free.
        external_call["KGEN_CompilerRT_AsyncRT_Execute", NoneType](_run_cell, c.unsafe_bitcast[UInt8](), -1)

    with FlushDenormals():
        func(0)

    for h in range(helpers):
        var c = _cell(cells, h)
        var done = c.unsafe_offset(_DONE)
        var spins = 0
        while Atomic.load(done) == 0 and spins < WAIT_SPINS:
            spins += 1
        if Atomic.load(done) == 0:
            external_call["KGEN_CompilerRT_AsyncRT_Wait", NoneType](c.unsafe_offset(_CHAIN))
            while Atomic.load(done) == 0:  # Complete comes just before done
                pass
        external_call["KGEN_CompilerRT_AsyncRT_DestroyChain", NoneType](c.unsafe_offset(_CHAIN))
        var handle = Int(c[unsafe_offset=_HANDLE])
        _coro_destroy_fn(Pointer(to=handle).unsafe_bitcast[AnyCoroutine]()[])
    block.unsafe_free()
