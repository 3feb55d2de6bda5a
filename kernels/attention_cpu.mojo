# CPU causal GQA attention with online (flash-style) softmax in fp32, for ragged prefill, prefill with
# history and decode (the K/V source is a KVView: contiguous or paged).
#
# Work is split into tasks (sequence b, kv head g, tile of query tokens, key split). A tile holds the
# G = Hq / Hkv query heads of up to TQ tokens (ROWS rows in all), so each key and value row is loaded
# once per tile and used by every row of it. Scores are computed a block of BK keys at a time, then
# the running max / denominator / output of each row are rescaled (online softmax). When a batch has
# few tiles and long contexts (decode), the keys are split across tasks as well (flash-decoding) and
# the partial results are merged in a second pass, so both cores stay busy for one sequence.
# Decode runs in slot order (slot_task): when every sequence fits one token tile per kv head, a task
# takes a key range of one sequence and walks it SLOT_KEYS keys at a time for all of its kv heads,
# so it reads whole slots (all heads of a token are contiguous in MAX's layout) in order. Head order
# (one task per head) read 512-byte rows 4 KB apart, which DRAM and the hardware prefetchers serve at
# half the rate of contiguous rows. Zen 3, in-process A/B, 32/8 heads, D = 128: 4096 keys 2706-3076
# -> 1956-2335 us; 1024 keys -7%; 9/3 heads 4096 keys -10 to -17%. Windows of 32 keys measured no
# better there (see SLOT_KEYS for AVX-512); software prefetch of the next window's slots neither (the
# hardware prefetchers follow slot order; on Zen 5 two windows ahead gained only while the cache sat
# in L3, not from DRAM). On Zen 4 one window ahead did gain (NEXT_WINDOW_PREFETCH); besides it, slot
# order prefetches each block's value rows into L1 (attention_tile.mojo, _prefetch_block_rows). Key
# splits of 256-512 keys with the tasks ordered so the two cores read neighbouring heads of the same
# slots measured 3-7% slower (merge pass), not kept.
# Zen 3 (2026-12-03), 32/8 heads, 4096 keys: one core reads this op's K/V at ~8.5 GB/s against 19 GB/s
# for a plain sequential read and ~20 GB/s of compute alone (block kernel 51 ns per key and kv head
# in cache, 114-145 from DRAM): reading and computing take turns. A stream prefetch of the next
# window's K and V, two lines per chunk of the score loop into L2, made the one-core block kernel
# from DRAM 27% faster (12 of 12 interleaved rounds, also with two processes at once) but the op in
# a graph 16-24% slower (0 of 20 rounds faster), with both cores at ~170 ns per key and kv head
# either way; loading each window before computing it: no gain (4 of 6). Not kept.
# The tile itself (scores, online softmax, P @ V) is attention_tile.mojo.

from std.math import exp, sqrt
from std.sys.info import CompilationTarget
from max.gpu.host import DeviceContext

from .attention_tile import (
    BK, NEG_INF, ROWS, key_end, run_tile, tile_block, tile_floats, tile_init, tile_kt, tile_ml, tile_scores, write_rows,
)
from .common import F32, FW, Ptr, ceil_div, cpu_threads, parallel_for, scratch
from .kv_layout import KVView

# Slot order prefetches the next window's slots (K and V rows of every kv head) into L2
# (prefetcht1) on Zen 4, spread over this window: each head's block of this window requests its
# share of the next window's (key, head) pairs, a few per group of 4 keys, in address order
# (attention_tile._prefetch_next_window). Zen 4, 32/8 heads, D = 128, 4096 keys:
# - all of the next window at the start of this one (64-key windows): standalone
#   (profile_attention), 6 alternating runs, 11.6-13.7 -> 12.8-19.1 GB/s of K/V (faster in 5);
#   in-graph interleaved, 6 rounds, 2410-3757 -> 1992-3217 us (faster in 5 of 6; MAX 5069-8001).
#   Two windows ahead measured no better (1856-1938 vs 1493-1852 us in 3 alternating runs).
# - spread instead of all at the start: standalone, 6 alternating runs, 975-1204 -> 830-957 us
#   (faster in 6); in a graph, 8 interleaved rounds, medians of rounds 1223 -> 899 us (faster in 8;
#   MAX 4279). Spread with 16- or 64-key windows or two windows ahead: no better (5 alternating
#   runs, 829-881 / 864-926 / 861-923 vs 816-939 us). 1024 keys, 9/3 heads at 512 and 4096 keys and
#   32/8 at 256: unchanged or 1-4% faster.
# Zen 3 and Zen 5 measured no gain from the burst form from DRAM (see the header), so they keep the
# hardware prefetchers alone. The spread form on Zen 3 (2026-12-04), chains of 30 ops, 32/8 heads,
# 4096 keys, 10 interleaved rounds: 52162 -> 52845 us per 30 ops (faster in 4 of 10), not enabled;
# it is untried on Zen 5.
comptime NEXT_WINDOW_PREFETCH = CompilationTarget._is_arch["znver4"]()
# Slot-ordered decode: keys per window (K and V of all kv heads: 8 KB a key at 8 x 128). 16 with AVX2,
# where windows of 32 measured no better (Zen 3, 512 KB L2). 64 (= BK, the most one score block
# takes) with AVX-512: the per-window softmax and setup are paid 4x less often. Zen 5 (1 MB L2),
# benchmarks/profile_attention.mojo, 9 alternating rounds: block kernel in cache 18.4-19.3 ->
# 15.5-16.9 ns per key and kv head (9 of 9); whole op 32/8 heads 4096 keys 835-1068 -> 795-980 us
# (faster in 7 of 9), 1024 keys 153-200 -> 136-189 us (7 of 9); 4 rounds: 9/3 heads 512 keys 39-50
# -> 35-42 us (4 of 4), 32/8 heads 256 keys mixed (66-75 vs 61-75 us).
# 32 with the next-window prefetch (Zen 4): a window and the next one prefetched, 2 x 512 KB with
# 64 keys, filled the 1 MB L2, and the prefetch evicted the window being read. Zen 4, 32/8 heads,
# 4096 keys, standalone, 6 alternating runs: 64 keys 2200-3164 us, 32 keys 1682-1866 (faster in 6),
# 16 keys 1536-2415; block kernel in cache 27-34 ns per key and kv head at 64, 29-36 at 32, 32-40 at 16.
# In a graph, 8 interleaved rounds, medians of rounds: no prefetch 3027 us, 64 keys 3100, 32 keys
# 2168 (faster than both in 8 of 8; MAX 8040).
comptime SLOT_KEYS = (32 if NEXT_WINDOW_PREFETCH else BK) if FW == 16 else 16


# With fewer units of work than cores (batch-1 decode), keys are split below 512 keys too once the
# longest sequence has this many K floats (all kv heads): 128 KB, ~25 us of one core's work against
# the ~8 us a parallel op's hand-off costs.
comptime SPLIT_MIN_FLOATS = 32768


# Measured on Zen 3, 2 cores, chains of 30 ops in a graph, interleaved rounds, before -> after:
#   - one sequence below 512 keys was one task on one core; now two once it holds
#     SPLIT_MIN_FLOATS: 32/8 heads D = 128, 200 keys 164 -> 117 us per op (faster in 8 of 8
#     rounds), 300 keys 174 -> 102 (8 of 8); 9/3 heads D = 64, 200 keys 22.9 -> 20.2 (7 of 8),
#     350 keys 37.4 -> 26.8 (10 of 10).
#   - 3 splits (513-768 keys) left one worker 2 tasks while the other had 1; now 2: 32/8 heads,
#     700 keys 264 -> 221 us (8 of 8). 9/3 heads, 541 keys: mixed (faster in 10 of 14 rounds and
#     4 of 8), and 4 splits measured slower there (0 of 12), so the rounding goes down.
def key_splits(units: Int, workers: Int, max_ctx: Int, kv_row: Int) -> Int:
    """Key ranges per unit of work (a sequence in slot order, else a tile), flash-decoding style.

    Args:
        units: Tasks before splitting.
        workers: Cores the tasks share.
        max_ctx: Keys of the longest sequence.
        kv_row: K floats per key (Hkv * D).

    Returns:
        Splits per unit: up to two tasks per worker when units are few, no more than one split per
        256 keys beyond one task per worker, and whole rounds of tasks (units * splits a multiple of
        workers) once there are more tasks than workers.
    """
    var idle_cores = units < workers and max_ctx * kv_row >= SPLIT_MIN_FLOATS
    if units >= 2 * workers or (max_ctx < 512 and not idle_cores):
        return 1
    var splits = min(ceil_div(2 * workers, units), max(ceil_div(workers, units), ceil_div(max_ctx, 256)))
    while splits > 1 and units * splits > workers and (units * splits) % workers != 0:
        splits -= 1
    return splits


def attention_cpu[D: Int](
    o: Ptr[F32], q: Ptr[F32], kv: KVView[F32], offsets: Ptr[DType.uint32], cache_lens: Ptr[DType.uint32],
    has_cache: Bool, B: Int, Hq: Int, Hkv: Int, ctx: DeviceContext,
) raises:
    """Computes o[t, h, :] = softmax(q[t, h] . K^T / sqrt(D)) V over the causal prefix of t's sequence.

    Without a cache (has_cache False, ragged prefill) every sequence starts at position 0.
    """
    comptime assert D % FW == 0, "head_dim must be a multiple of the SIMD width"
    var G = Hq // Hkv
    var tq = max(1, ROWS // G)
    var scale = Float32(1.0) / sqrt(Float32(D))
    # Tiles: (b, g, token tile). Each gets `splits` key ranges when there are too few tiles.
    var n_tiles = 0
    var max_ctx = 0
    var one_tile_per_head = True  # every sequence fits one token tile per kv head (decode)
    var n_seqs = 0                # sequences with new tokens
    for b in range(B):
        var n_new = Int(offsets[unsafe_offset=b + 1]) - Int(offsets[unsafe_offset=b])
        n_tiles += ceil_div(n_new, tq) * Hkv
        if n_new > tq:
            one_tile_per_head = False
        if n_new > 0:
            n_seqs += 1
        var base = Int(cache_lens[unsafe_offset=b]) if has_cache else 0
        max_ctx = max(max_ctx, base + n_new)
    if n_tiles == 0:
        return
    # Slot order: one task walks a key range of one sequence for all its kv heads, a window of
    # SLOT_KEYS keys at a time, so it reads whole slots (all heads of a token, contiguous) in order
    # instead of one head's rows 4 KB apart.
    var slot_order = one_tile_per_head and Hkv > 1
    var units = n_seqs if slot_order else n_tiles  # what the key splits multiply
    var splits = key_splits(units, cpu_threads(), max_ctx, Hkv * D)
    var tile_b = scratch[DType.int64](n_tiles * 3)  # (b, g, first token) per tile
    var seq_b = scratch[DType.int64](2 * n_seqs)     # (b, first tile) per sequence with new tokens
    var i = 0
    var si = 0
    for b in range(B):
        var s0 = Int(offsets[unsafe_offset=b])
        var s1 = Int(offsets[unsafe_offset=b + 1])
        if s1 > s0:
            seq_b[unsafe_offset=2 * si] = Int64(b)
            seq_b[unsafe_offset=2 * si + 1] = Int64(i)
            si += 1
        for g in range(Hkv):
            var t = s0
            while t < s1:
                tile_b[unsafe_offset=3 * i] = Int64(b)
                tile_b[unsafe_offset=3 * i + 1] = Int64(g)
                tile_b[unsafe_offset=3 * i + 2] = Int64(t)
                i += 1
                t += tq
    var per_task = tile_floats[D]()
    var work = scratch[F32](n_tiles * splits * per_task)

    def task(id: Int) {var o, var q, var kv, var offsets, var cache_lens, var has_cache, var Hq, var G, var tq, var scale,
                       var splits, var tile_b, var work, var per_task}:
        var tile = id // splits
        var split = id % splits
        var b = Int(tile_b[unsafe_offset=3 * tile])
        var g = Int(tile_b[unsafe_offset=3 * tile + 1])
        var t0 = Int(tile_b[unsafe_offset=3 * tile + 2])
        var seq_start = Int(offsets[unsafe_offset=b])
        var t1 = min(Int(offsets[unsafe_offset=b + 1]), t0 + tq)
        var ctx_start = Int(cache_lens[unsafe_offset=b]) if has_cache else 0
        var n_keys = ctx_start + (t1 - 1 - seq_start) + 1
        var chunk = ceil_div(n_keys, splits)
        var mem = work.unsafe_offset(id * per_task)
        run_tile[D](q, kv, b, g, G, Hq, seq_start, ctx_start, t0, t1, split * chunk,
                 min(n_keys, (split + 1) * chunk), scale, mem, tile_ml[D](mem), tile_scores[D](mem), tile_kt[D](mem))
        if splits == 1:
            write_rows[D](o, mem, tile_ml[D](mem), t0, t1, g, G, Hq)

    def slot_task(id: Int) {var o, var q, var kv, var offsets, var cache_lens, var has_cache, var Hq, var Hkv, var G,
                            var scale, var splits, var seq_b, var work, var per_task}:
        var b = Int(seq_b[unsafe_offset=2 * (id // splits)])
        var first_tile = Int(seq_b[unsafe_offset=2 * (id // splits) + 1])
        var split = id % splits
        var seq_start = Int(offsets[unsafe_offset=b])
        var t1 = Int(offsets[unsafe_offset=b + 1])
        var ctx_start = Int(cache_lens[unsafe_offset=b]) if has_cache else 0
        var n_keys = ctx_start + (t1 - 1 - seq_start) + 1
        # Whole windows per split keep a window inside one page (page sizes are multiples of it).
        var chunk = ceil_div(ceil_div(n_keys, splits), SLOT_KEYS) * SLOT_KEYS
        var k_lo = min(n_keys, split * chunk)
        var k_end = key_end(seq_start, ctx_start, t1, k_lo + chunk)
        for g in range(Hkv):
            var mem = work.unsafe_offset(((first_tile + g) * splits + split) * per_task)
            tile_init[D]((t1 - seq_start) * G, mem, tile_ml[D](mem))
        var j0 = k_lo
        while j0 < k_end:
            var j1 = min(k_end, j0 + SLOT_KEYS)
            # The next window's (key, head) pairs, spread over this window's head blocks (see
            # NEXT_WINDOW_PREFETCH).
            var nxt = (min(k_end, j1 + SLOT_KEYS) - j1) if NEXT_WINDOW_PREFETCH else 0
            for g in range(Hkv):
                var mem = work.unsafe_offset(((first_tile + g) * splits + split) * per_task)
                tile_block[D, False](q, kv, b, g, G, Hq, seq_start, ctx_start, seq_start, t1, j0, j1, k_end,
                                      scale, mem, tile_ml[D](mem), tile_scores[D](mem), tile_kt[D](mem),
                                      j1, g * nxt, (g + 1) * nxt, Hkv)
            j0 = j1
        if splits == 1:
            for g in range(Hkv):
                var mem = work.unsafe_offset((first_tile + g) * per_task)
                write_rows[D](o, mem, tile_ml[D](mem), seq_start, t1, g, G, Hq)

    if slot_order:
        parallel_for(slot_task, n_seqs * splits, ctx)
    else:
        parallel_for(task, n_tiles * splits, ctx)

    if splits > 1:
        # Merge the key splits of each tile: rescale every partial to the global max.
        for tile in range(n_tiles):
            var b = Int(tile_b[unsafe_offset=3 * tile])
            var g = Int(tile_b[unsafe_offset=3 * tile + 1])
            var t0 = Int(tile_b[unsafe_offset=3 * tile + 2])
            var t1 = min(Int(offsets[unsafe_offset=b + 1]), t0 + tq)
            for r in range((t1 - t0) * G):
                var m = NEG_INF
                for s in range(splits):
                    m = max(m, tile_ml[D](work.unsafe_offset((tile * splits + s) * per_task))[unsafe_offset=2 * r])
                var l = Float32(0)
                var acc = Array[SIMD[F32, FW], D // FW](fill=SIMD[F32, FW](0))
                for s in range(splits):
                    var mem = work.unsafe_offset((tile * splits + s) * per_task)
                    var ml = tile_ml[D](mem)
                    var ls = ml[unsafe_offset=2 * r + 1]
                    if ls == 0:
                        continue
                    var w = exp(ml[unsafe_offset=2 * r] - m)
                    l += ls * w
                    comptime for k in range(D // FW):
                        acc[k] = mem.unsafe_load[width=FW](r * D + k * FW).fma(SIMD[F32, FW](w), acc[k])
                var t = t0 + r // G
                var dst = o.unsafe_offset((t * Hq + g * G + r % G) * D)
                comptime for k in range(D // FW):
                    dst.unsafe_store(k * FW, acc[k] / l)
    work.unsafe_free()
    tile_b.unsafe_free()
    seq_b.unsafe_free()
