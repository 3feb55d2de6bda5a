# CPU causal GQA attention with online (flash-style) softmax in fp32, for ragged prefill, prefill with
# history and decode (the K/V source is a KVView: contiguous or paged).
#
# Work is split into tasks (sequence b, kv head g, tile of query tokens, key split). A tile holds the
# G = Hq / Hkv query heads of up to TQ tokens (ROWS rows in all), so each key and value row is loaded
# once per tile and used by every row of it. When a batch has few tiles and long contexts (decode),
# the keys are split across tasks as well (flash-decoding) and the partials merged in a second pass,
# so every core stays busy for one sequence.
# Decode runs in slot order (slot_task) when every sequence fits one token tile per kv head: a task
# walks a key range of one sequence SLOT_KEYS keys at a time for all of its kv heads, reading whole
# slots (all heads of a token are contiguous in MAX's layout) in order; one task per head would read
# rows 4 KB apart, which DRAM and the hardware prefetchers serve at a lower rate.
# The tile itself (scores, online softmax, P @ V) is attention_tile.mojo; design notes and what was
# tried are in docs/kernels.md.

from std.math import exp, sqrt
from max.gpu.host import DeviceContext

from .attention_tile import (
    BK, NEG_INF, ROWS, key_end, run_tile, tile_block, tile_floats, tile_init, tile_kt, tile_ml, tile_scores,
    window_start, write_rows,
)
from .common import F32, FW, Ptr, ceil_div, cpu_threads, parallel_for, scratch
from .cpu_tuning import NEXT_WINDOW_PREFETCH
from .kv_layout import KVView

# Slot-ordered decode: keys per window (K and V of all kv heads). 16 with AVX2 (larger windows gained
# nothing). 64 (= BK, the most one score block takes) with AVX-512: the per-window softmax and setup
# are paid less often. 32 where the next window is prefetched (cpu_tuning.NEXT_WINDOW_PREFETCH,
# spread over this window's head blocks, attention_tile._prefetch_next_window): a window and the next
# one at 64 keys filled L2, and the prefetch evicted the window being read.
comptime SLOT_KEYS = (32 if NEXT_WINDOW_PREFETCH else BK) if FW == 16 else 16


# With fewer units of work than cores (batch-1 decode), keys are split below 512 keys too once the
# longest sequence has this many K floats (all kv heads, 128 KB): well above the cost of a parallel
# op's hand-off in one core's work.
comptime SPLIT_MIN_FLOATS = 32768


# Splitting a short sequence over both cores once it holds SPLIT_MIN_FLOATS, and rounding the splits
# down to whole rounds of tasks (3 splits left one worker 2 tasks while the other had 1; 4 measured
# slower), both measured faster in a graph.
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
    has_cache: Bool, B: Int, Hq: Int, Hkv: Int, ctx: DeviceContext, window: Int = 0,
) raises:
    """Computes o[t, h, :] = softmax(q[t, h] . K^T / sqrt(D)) V over the causal prefix of t's sequence,
    or with window > 0 over its last `window` positions (t's own included).

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
                       var splits, var tile_b, var work, var per_task, var window}:
        var tile = id // splits
        var split = id % splits
        var b = Int(tile_b[unsafe_offset=3 * tile])
        var g = Int(tile_b[unsafe_offset=3 * tile + 1])
        var t0 = Int(tile_b[unsafe_offset=3 * tile + 2])
        var seq_start = Int(offsets[unsafe_offset=b])
        var t1 = min(Int(offsets[unsafe_offset=b + 1]), t0 + tq)
        var ctx_start = Int(cache_lens[unsafe_offset=b]) if has_cache else 0
        var n_keys = ctx_start + (t1 - 1 - seq_start) + 1
        var k_first = window_start(ctx_start + t0 - seq_start, window)  # keys before it are out of sight
        var chunk = ceil_div(n_keys - k_first, splits)
        var mem = work.unsafe_offset(id * per_task)
        run_tile[D](q, kv, b, g, G, Hq, seq_start, ctx_start, t0, t1, k_first + split * chunk,
                 min(n_keys, k_first + (split + 1) * chunk), scale, mem, tile_ml[D](mem), tile_scores[D](mem),
                 tile_kt[D](mem), window)
        if splits == 1:
            write_rows[D](o, mem, tile_ml[D](mem), t0, t1, g, G, Hq)

    def slot_task(id: Int) {var o, var q, var kv, var offsets, var cache_lens, var has_cache, var Hq, var Hkv, var G,
                            var scale, var splits, var seq_b, var work, var per_task, var window}:
        var b = Int(seq_b[unsafe_offset=2 * (id // splits)])
        var first_tile = Int(seq_b[unsafe_offset=2 * (id // splits) + 1])
        var split = id % splits
        var seq_start = Int(offsets[unsafe_offset=b])
        var t1 = Int(offsets[unsafe_offset=b + 1])
        var ctx_start = Int(cache_lens[unsafe_offset=b]) if has_cache else 0
        var n_keys = ctx_start + (t1 - 1 - seq_start) + 1
        # A sliding window's first key, rounded down to a whole slot window (tile_block masks the rest).
        var k_first = (window_start(ctx_start, window) // SLOT_KEYS) * SLOT_KEYS
        # Whole windows per split keep a window inside one page (page sizes are multiples of it).
        var chunk = ceil_div(ceil_div(n_keys - k_first, splits), SLOT_KEYS) * SLOT_KEYS
        var k_lo = min(n_keys, k_first + split * chunk)
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
                                      j1, g * nxt, (g + 1) * nxt, Hkv, window)
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
