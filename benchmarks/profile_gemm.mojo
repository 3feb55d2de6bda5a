# Standalone fp32 GEMM driver for profiling (kernels/gemm_cpu.mojo): no graph, no JIT, so
# `perf annotate` sees the micro-kernel's instructions. Timing only, no baseline: speed claims belong to
# `crucible bench kernels`, which runs MAX's ops.matmul beside ours in one process.
#
#   .venv/bin/mojo build -I . -O3 benchmarks/profile_gemm.mojo -o /tmp/profile_gemm
#   /tmp/profile_gemm [M K N reps]                      (default: 512 1536 1536 30)
#
# Two numbers:
#   micro-kernel, one core: _micro_tile over MC / MR tiles of packed x against one packed KC x NR panel,
#     all cache-resident, best of `reps`: GFLOP/s of the FMA loop alone (the compute ceiling per core).
#   whole op: gemm_cpu on all cores, x [M, K] @ W[N, K]^T, best and median of `reps` calls: GFLOP/s
#     with packing, C updates and the parallel hand-off; 64 entries spot-checked against float64.
# The printed checksum only keeps the compiler from dropping the work (the conformance grid checks results).

from max.gpu.host import DeviceContext
from std.sys import argv
from std.time import perf_counter_ns

from kernels.common import BytePtr, F32, Ptr, scratch
from kernels.gemm_cpu import KC, MC, MR, NR, _micro_tile, gemm_cpu


def _fill(p: Ptr[F32], n: Int, seed: Int):
    for i in range(n):
        p[unsafe_offset=i] = Float32((i * 37 + seed) % 101) * 0.01 - 0.5


def micro(reps: Int):
    comptime TILES = MC // MR
    var a = scratch[F32](TILES * MR * KC)
    var bp = scratch[F32](KC * NR)
    var c = scratch[F32](TILES * MR * NR)
    _fill(a, TILES * MR * KC, 1)
    _fill(bp, KC * NR, 2)
    var best = Float64(1e30)
    for _ in range(reps):
        var t0 = perf_counter_ns()
        for _ in range(50):
            for t in range(TILES):
                _micro_tile[False, True](a.unsafe_offset(t * MR * KC), bp, c.unsafe_offset(t * MR * NR), NR, KC, MR, NR)
        best = min(best, Float64(perf_counter_ns() - t0) / 50.0)
    var flops = Float64(2 * TILES * MR * NR * KC)
    print("micro-kernel, one core, cache-resident, MR", MR, "NR", NR, "KC", KC, ":", flops / best, "GFLOP/s,",
          best / Float64(TILES * KC), "ns per k step (checksum", c[unsafe_offset=0], ")")
    a.unsafe_free()
    bp.unsafe_free()
    c.unsafe_free()


def whole(M: Int, K: Int, N: Int, reps: Int, ctx: DeviceContext) raises:
    var x = scratch[F32](M * K)
    var w = scratch[F32](N * K)
    var y = scratch[F32](M * N)
    _fill(x, M * K, 3)
    _fill(w, N * K, 4)
    var wb = rebind[BytePtr](w)
    gemm_cpu["f32"](y, x, wb, K * 4, M, N, K, ctx, N)
    var times = List[Float64]()
    for _ in range(reps):
        var t0 = perf_counter_ns()
        gemm_cpu["f32"](y, x, wb, K * 4, M, N, K, ctx, N)
        times.append(Float64(perf_counter_ns() - t0))
    sort(times)
    # Spot check against a float64 dot product: a driver that times wrong results is no profile.
    var worst = Float64(0)
    for s in range(64):
        var i = (s * 7919) % M
        var j = (s * 104729 + 17) % N
        var want = Float64(0)
        for k in range(K):
            want += Float64(x[unsafe_offset=i * K + k]) * Float64(w[unsafe_offset=j * K + k])
        worst = max(worst, abs(Float64(y[unsafe_offset=i * N + j]) - want))
    var flops = Float64(2 * M * N * K)
    print("whole op, all cores, M", M, "K", K, "N", N, ": best", times[0] / 1000.0, "us (", flops / times[0],
          "GFLOP/s ), median", times[len(times) // 2] / 1000.0, "us (", flops / times[len(times) // 2],
          "GFLOP/s ) (checksum", y[unsafe_offset=0], ")")
    print("spot check, 64 entries: max abs error", worst)
    x.unsafe_free()
    w.unsafe_free()
    y.unsafe_free()


def main() raises:
    var args = argv()
    var M = atol(args[1]) if len(args) > 1 else 512
    var K = atol(args[2]) if len(args) > 2 else 1536
    var N = atol(args[3]) if len(args) > 3 else 1536
    var reps = atol(args[4]) if len(args) > 4 else 30
    var ctx = DeviceContext(api="cpu")
    micro(reps)
    whole(M, K, N, reps, ctx)
