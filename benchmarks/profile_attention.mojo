# Standalone decode-attention driver for profiling: calls kernels/attention_cpu.mojo directly (no
# graph, no JIT), so `perf record` / `perf annotate` see the kernel's symbols and instructions.
# Timing only, no baseline: speed claims belong to `crucible bench kernels`.
#
#   .venv/bin/mojo build -I . -O3 benchmarks/profile_attention.mojo -o /tmp/profile_attention
#   /tmp/profile_attention [Hq Hkv cached_keys iterations]       (default: 32 8 4095 1000, D = 128)
#   perf record -o /tmp/perf.data /tmp/profile_attention && perf annotate -i /tmp/perf.data --stdio
#
# What it prints:
#   whole op: K/V sit in a MAX-layout paged cache [pages, 2, 1 layer, 128 slots, Hkv, 128] with a
#     shuffled page table; one sequence decodes one token over `cached_keys` + 1 keys, on all cores.
#   block kernel, one core: tile_block (attention_tile.mojo) over windows of SLOT_KEYS keys of every
#     kv head, as slot order runs it, on contiguous keys, best of 5, in ns per key and kv head:
#     - cache-resident: one window (128 KB of K/V at 8 heads), again and again: the compute cost,
#       without the DRAM reads that dominate the whole op;
#     - all keys in turn: the windows of `cached_keys` + 1 keys one after another, from DRAM when
#       their K/V exceed the caches (32 MB at 4096 keys and 8 heads): compute and reads on one core
#       (where this is much slower than the cache-resident case, the reads and the compute take turns).
#     The head counts stay runtime values, as the op gets them: a scratch build with them as
#     constants compiled the score loop differently (it hoisted and spilled the key vectors) and
#     made a variant look 11% faster that measured the same here.
#   read probe: crucible.read_bandwidth's CPU body (bandwidth.read_sum_cpu) on 256 MB, all cores,
#     timed between the whole op's runs: the ceiling the benchmark's bandwidth target uses.

from max.gpu.host import DeviceContext
from std.sys import argv
from std.time import perf_counter_ns

from kernels.attention_cpu import SLOT_KEYS, attention_cpu
from kernels.attention_tile import tile_block, tile_floats, tile_init, tile_kt, tile_ml, tile_scores
from kernels.bandwidth import read_sum_cpu
from kernels.common import F32, ceil_div, scratch
from kernels.kv_layout import KVView


def block_kernel[D: Int](hq: Int, hkv: Int, reps: Int, windows: Int) raises:
    # The decode block kernel alone: one token, G = hq / hkv query rows per kv head, ragged K/V of
    # `windows` windows, walked in turn (1: one window, cache-resident).
    comptime KEYS = SLOT_KEYS
    var G = hq // hkv
    var n = KEYS * windows * hkv * D
    var k = scratch[F32](n)
    var v = scratch[F32](n)
    for i in range(n):
        k[unsafe_offset=i] = Float32((i * 7919) % 1000) * 0.001
        v[unsafe_offset=i] = Float32((i * 31) % 1000) * 0.001
    var q = scratch[F32](hq * D)
    for i in range(hq * D):
        q[unsafe_offset=i] = 0.01 * Float32(i % 17)
    var kv = KVView[F32].ragged(k, v, hkv, D)
    # One task's scratch per kv head, in attention_cpu's layout (tile_floats and its accessors).
    var per_task = tile_floats[D]()
    var work = scratch[F32](hkv * per_task)
    for g in range(hkv):
        var mem = work.unsafe_offset(g * per_task)
        tile_init[D](G, mem, tile_ml[D](mem))
    var keys = KEYS * windows
    var passes = max(1, reps // windows)  # about the same number of blocks either way
    var best = Float64(1e30)
    for _ in range(5):
        var t0 = perf_counter_ns()
        for _ in range(passes):
            for w in range(windows):
                for g in range(hkv):  # window w's keys of each kv head in turn, as slot_task walks them
                    var mem = work.unsafe_offset(g * per_task)
                    tile_block[D, False](q, kv, 0, g, G, hq, 0, keys - 1, 0, 1, w * KEYS, (w + 1) * KEYS, keys,
                                          Float32(0.088), mem, tile_ml[D](mem), tile_scores[D](mem), tile_kt[D](mem))
        best = min(best, Float64(perf_counter_ns() - t0) / Float64(passes * keys * hkv))
    print("block kernel, one core,", "cache-resident," if windows == 1 else "all keys in turn,", "Hq", hq, "Hkv", hkv, "D", D,
          "keys", keys, "in windows of", KEYS, ":", best, "ns per key and kv head (checksum", work[unsafe_offset=0], ")")
    k.unsafe_free()
    v.unsafe_free()
    q.unsafe_free()
    work.unsafe_free()


def main() raises:
    comptime D = 128
    comptime PAGE = 128
    var args = argv()
    var hq = atol(args[1]) if len(args) > 1 else 32
    var hkv = atol(args[2]) if len(args) > 2 else 8
    var cached = atol(args[3]) if len(args) > 3 else 4095
    var iters = atol(args[4]) if len(args) > 4 else 1000
    block_kernel[D](hq, hkv, max(100, iters), 1)
    var keys = cached + 1
    block_kernel[D](hq, hkv, max(100, iters), ceil_div(keys, SLOT_KEYS))
    var pages = keys // PAGE + 1
    var page_elems = KVView[F32].dense_page_elems(1, PAGE, hkv, D)
    var blocks = scratch[F32](pages * page_elems)
    for i in range(pages * page_elems):
        blocks[unsafe_offset=i] = Float32((i * 7919) % 1000) * 0.001
    var lut = scratch[DType.uint32](pages)
    for i in range(pages):
        lut[unsafe_offset=i] = UInt32((i * 5 + 3) % pages)  # pages out of order, as a cache hands them
    var q = scratch[F32](hq * D)
    for i in range(hq * D):
        q[unsafe_offset=i] = 0.01 * Float32(i % 17)
    var o = scratch[F32](hq * D)
    var offsets = scratch[DType.uint32](2)
    offsets[unsafe_offset=0] = 0
    offsets[unsafe_offset=1] = 1
    var cache_lens = scratch[DType.uint32](1)
    cache_lens[unsafe_offset=0] = UInt32(cached)
    var kv = KVView[F32].paged_dense(blocks, lut, pages, PAGE, 1, 0, hkv, D)
    var ctx = DeviceContext(api="cpu")
    for _ in range(5):
        attention_cpu[D](o, q, kv, offsets, cache_lens, True, 1, hq, hkv, ctx)
    # The whole op in 5 runs of iters / 5 calls, each followed by a read probe on 256 MB (best rate).
    var per_run = max(1, iters // 5)
    var probe_n = 1 << 26
    var probe = scratch[F32](probe_n)
    for i in range(probe_n):
        probe[unsafe_offset=i] = 1
    var probe_gbps = Float64(0)
    var total_ns = 0
    var sink = Float32(0)
    for _ in range(5):
        var t0 = perf_counter_ns()
        for _ in range(per_run):
            attention_cpu[D](o, q, kv, offsets, cache_lens, True, 1, hq, hkv, ctx)
        var t1 = perf_counter_ns()
        sink += read_sum_cpu(probe, probe_n, ctx)
        var t2 = perf_counter_ns()
        total_ns += Int(t1 - t0)
        probe_gbps = max(probe_gbps, Float64(probe_n * 4) / Float64(t2 - t1))
    var us = Float64(total_ns) / Float64(5 * per_run) / 1000.0
    var kv_bytes = Float64(2 * keys * hkv * D * 4)
    var gbps = kv_bytes / us / 1000.0
    print("decode attention, Hq", hq, "Hkv", hkv, "D", D, "keys", keys, ":", us, "us per call,", gbps,
          "GB/s of K/V,", 100.0 * gbps / probe_gbps, "% of the read probe's best", probe_gbps, "GB/s (checksum", sink, ")")
    probe.unsafe_free()
