# GPU causal GQA attention with online softmax (fp32 statistics and accumulation), for the same K/V
# sources as the CPU path (kv_layout.mojo). Split-K ("flash-decoding") over the keys, with the query
# heads of a KV group sharing each K/V read.
#
# Grid (token t, head group y, split s). A block takes HB <= MAX_HB query heads of one KV group and the
# key chunks c = s * WARPS + w (WARP_SIZE keys each), stepping S * WARPS, for its warp w. Per chunk:
# scores (lane l dots key c * WARP_SIZE + l, read once with 16-byte loads, with the HB pre-scaled
# query rows staged in shared memory); softmax (per head, the warp's running max, per-lane
# denominators); P @ V (each lane owns D / WARP_SIZE output dims, so a V row is one coalesced warp read
# shared by the HB heads). Warps merge through shared memory; with S > 1 each block writes an
# unnormalized partial (m, l, acc) and a second kernel merges the splits per (t, head).
# Why split: a decode step has one token, so (token, head) parallelism alone leaves most SMs idle; S
# targets about TARGET_BLOCKS blocks. Splits interleave chunks because the host does not know the
# sequence lengths (they live on the device). A sliding window (window > 0) skips the chunks wholly
# before a query's window and masks the keys of the one it starts in. Why share K/V across heads: one
# block per query head read a group's K/V once per query head.

from std.math import exp, sqrt
from std.memory import stack_allocation
from std.sys import size_of
from max.gpu import WARP_SIZE, barrier, block_idx, lane_id, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import max as warp_max, shuffle_idx, sum as warp_sum

from .common import F32, Ptr, ceil_div
from .kv_layout import KVView
from .rope import sequence_of

comptime WARPS = 4
comptime MAX_D = 256
comptime MAX_HB = 8          # query heads per block: GQA ratios up to 8 in one block, larger ones split
comptime MAX_SPLITS = 64
comptime TARGET_BLOCKS = 264  # 2 blocks per SM of an H100/H200
comptime NEG_INF = Float32(-3.0e38)


@always_inline
def _merge_partials[origin: Origin, space: AddressSpace, //](
    first: Pointer[Float32, origin, address_space=space], n: Int, stride: Int, d: Int,
) -> Tuple[Float32, Float32, Float32]:
    """Log-sum-exp merge of n unnormalized partials (m, l, acc[D]) laid `stride` floats apart.

    Returns the merged partial at dim d: (m, l, acc[d]) rescaled to the largest m, so o[d] = acc[d] / l. A partial with l = 0 saw
    no key and is skipped. Merges the warps of a block (shared memory) and the splits of a token
    (the global workspace).
    """
    var m_all = NEG_INF
    for s in range(n):
        if first[unsafe_offset=s * stride + 1] > 0:
            m_all = max(m_all, first[unsafe_offset=s * stride])
    var l_all = Float32(0)
    var o_all = Float32(0)
    for s in range(n):
        var ls = first[unsafe_offset=s * stride + 1]
        if ls > 0:
            var f = exp(first[unsafe_offset=s * stride] - m_all)
            l_all += ls * f
            o_all += first[unsafe_offset=s * stride + 2 + d] * f
    return (m_all, l_all, o_all)


def _attention_split_kernel[dtype: DType, D: Int, VEC: Int](
    o: Ptr[dtype], ws: Ptr[F32], q: Ptr[dtype], k_base: Ptr[dtype], v_base: Ptr[dtype],
    lookup: Ptr[DType.uint32], offsets: Ptr[DType.uint32], cache_lens: Ptr[DType.uint32], B: Int32,
    Hq: Int32, Hkv: Int32, HB: Int32, S: Int32, lookup_cols: Int64, page_size: Int64, page_stride: Int64,
    slot_stride: Int64, head_stride: Int64, paged: Int32, has_cache: Int32, window: Int32,
):
    # o: [T, Hq, D]; ws (S > 1): [T, Hq, S, D + 2] partials (m, l, acc[D]); q: [T, Hq, D].
    comptime PER_LANE = D // WARP_SIZE
    comptime WS = WARP_SIZE
    comptime ALIGN = VEC * size_of[dtype]()
    # A lane's V slice is 16-byte-row-aligned too when the key rows are (VEC > 1).
    comptime V_ALIGN = PER_LANE * size_of[dtype]() if VEC > 1 else size_of[dtype]()
    var kv = KVView[dtype](k_base, v_base, lookup, Int(lookup_cols), Int(page_size), Int(page_stride),
                           Int(slot_stride), Int(head_stride), paged != 0)
    var t = Int(block_idx.x)
    var hb = Int(HB)
    var h0 = Int(block_idx.y) * hb
    var s_idx = Int(block_idx.z)
    var n_splits = Int(S)
    var tid = Int(thread_idx.x)
    var lane = Int(lane_id())
    var w = tid // WS
    var hq = Int(Hq)
    var g = h0 // (hq // Int(Hkv))
    var b = sequence_of(t, offsets, Int(B))
    var seq_start = Int(offsets[unsafe_offset=b])
    var pos = (Int(cache_lens[unsafe_offset=b]) if has_cache != 0 else 0) + t - seq_start
    var lo = max(0, pos - Int(window) + 1) if window > 0 else 0  # the sliding window's first key
    var scale = Float32(1.0) / sqrt(Float32(D))

    var qs = stack_allocation[MAX_HB * D, Float32, address_space=AddressSpace.SHARED]()
    var part = stack_allocation[WARPS * MAX_HB * (D + 2), Float32, address_space=AddressSpace.SHARED]()
    var i = tid
    while i < hb * D:
        qs[unsafe_offset=i] = q[unsafe_offset=(t * hq + h0) * D + i].cast[F32]() * scale
        i += WARPS * WS
    barrier()

    var m = Array[Float32, MAX_HB](fill=NEG_INF)
    var l = Array[Float32, MAX_HB](fill=0)       # this lane's share of the denominator
    var acc = Array[SIMD[F32, PER_LANE], MAX_HB](fill=SIMD[F32, PER_LANE](0))
    var chunk = s_idx * WARPS + w
    while chunk * WS <= pos:
        if (chunk + 1) * WS <= lo:  # the whole chunk is before the window
            chunk += n_splits * WARPS
            continue
        var j = chunk * WS + lane
        var valid = j <= pos and j >= lo
        var sc = Array[Float32, MAX_HB](fill=NEG_INF)
        if valid:
            var kp = kv.key(b, seq_start, j, g)
            var dots = Array[SIMD[F32, VEC], MAX_HB](fill=SIMD[F32, VEC](0))
            comptime for d in range(0, D, VEC):
                var kv_vec = kp.unsafe_load[width=VEC, alignment=ALIGN](d).cast[F32]()
                comptime for r in range(MAX_HB):
                    if r < hb:
                        dots[r] = qs.unsafe_load[width=VEC](r * D + d).fma(kv_vec, dots[r])
            comptime for r in range(MAX_HB):
                sc[r] = dots[r].reduce_add()
        var p = Array[Float32, MAX_HB](fill=0)
        comptime for r in range(MAX_HB):
            if r < hb:
                var m_new = max(m[r], warp_max(sc[r]))
                var alpha = exp(m[r] - m_new)
                p[r] = exp(sc[r] - m_new) if valid else Float32(0)
                l[r] = l[r] * alpha + p[r]
                acc[r] *= alpha
                m[r] = m_new
        var n_valid = min(WS, pos + 1 - chunk * WS)
        for src in range(n_valid):
            var vp = kv.value(b, seq_start, chunk * WS + src, g)
            var v = vp.unsafe_load[width=PER_LANE, alignment=V_ALIGN](lane * PER_LANE).cast[F32]()
            comptime for r in range(MAX_HB):
                if r < hb:
                    acc[r] = v.fma(SIMD[F32, PER_LANE](shuffle_idx(p[r], UInt32(src))), acc[r])
        chunk += n_splits * WARPS

    # Merge the warps: part[w, r] = (m, l, acc[0..D)).
    comptime for r in range(MAX_HB):
        if r < hb:
            var lw = warp_sum(l[r])
            var mine = part.unsafe_offset((w * MAX_HB + r) * (D + 2))
            if lane == 0:
                mine[unsafe_offset=0] = m[r]
                mine[unsafe_offset=1] = lw
            comptime for e in range(PER_LANE):
                mine[unsafe_offset=2 + lane * PER_LANE + e] = acc[r][e]
    barrier()
    i = tid
    while i < hb * D:
        var r = i // D
        var d = i % D
        var m_all, l_all, o_all = _merge_partials(part.unsafe_offset(r * (D + 2)), WARPS, MAX_HB * (D + 2), d)
        var h = h0 + r
        if n_splits == 1:
            o[unsafe_offset=(t * hq + h) * D + d] = (o_all / l_all).cast[dtype]()
        else:
            var slot = ws.unsafe_offset(((t * hq + h) * n_splits + s_idx) * (D + 2))
            if d == 0:
                slot[unsafe_offset=0] = m_all
                slot[unsafe_offset=1] = l_all   # 0 when this split held none of the token's keys
            slot[unsafe_offset=2 + d] = o_all
        i += WARPS * WS


def _attention_merge_kernel[dtype: DType, D: Int](o: Ptr[dtype], ws: Ptr[F32], Hq: Int32, S: Int32):
    # One block of D threads per (token, head): o = sum_s acc_s e^(m_s - m) / sum_s l_s e^(m_s - m).
    var t = Int(block_idx.x)
    var h = Int(block_idx.y)
    var d = Int(thread_idx.x)
    var n_splits = Int(S)
    var row = ws.unsafe_offset((t * Int(Hq) + h) * n_splits * (D + 2))
    var _m, l_all, o_all = _merge_partials(row, n_splits, D + 2, d)
    o[unsafe_offset=(t * Int(Hq) + h) * D + d] = (o_all / l_all).cast[dtype]()


def heads_per_block(ratio: Int) -> Int:
    """Query heads one block takes: the whole GQA group, or its largest divisor <= MAX_HB."""
    var hb = min(ratio, MAX_HB)
    while ratio % hb != 0:
        hb -= 1
    return hb


def _launch_split[dtype: DType, D: Int](
    o: Ptr[dtype], ws: Ptr[F32], q: Ptr[dtype], kv: KVView[dtype], offsets: Ptr[DType.uint32],
    cache_lens: Ptr[DType.uint32], has_cache: Bool, T: Int, B: Int, Hq: Int, Hkv: Int, hb: Int,
    n_splits: Int, ctx: DeviceContext, window: Int,
) raises:
    """Enqueues the split kernel with 16-byte key loads, or scalar ones when a key row is not aligned."""
    comptime VEC = 16 // size_of[dtype]()
    var aligned = (Int(kv.base()) % 16 == 0 and Int(kv.v_base()) % 16 == 0 and kv.slot_stride % VEC == 0
                   and kv.head_stride % VEC == 0 and (not kv.paged or kv.page_stride % VEC == 0))
    if aligned:
        _enqueue_split[dtype, D, VEC](o, ws, q, kv, offsets, cache_lens, has_cache, T, B, Hq, Hkv, hb, n_splits, ctx, window)
    else:
        _enqueue_split[dtype, D, 1](o, ws, q, kv, offsets, cache_lens, has_cache, T, B, Hq, Hkv, hb, n_splits, ctx, window)


def _enqueue_split[dtype: DType, D: Int, VEC: Int](
    o: Ptr[dtype], ws: Ptr[F32], q: Ptr[dtype], kv: KVView[dtype], offsets: Ptr[DType.uint32],
    cache_lens: Ptr[DType.uint32], has_cache: Bool, T: Int, B: Int, Hq: Int, Hkv: Int, hb: Int,
    n_splits: Int, ctx: DeviceContext, window: Int,
) raises:
    ctx.enqueue_function[_attention_split_kernel[dtype, D, VEC]](
        o, ws, q, kv.base(), kv.v_base(), kv.lookup(), offsets, cache_lens, Int32(B), Int32(Hq),
        Int32(Hkv), Int32(hb), Int32(n_splits), Int64(kv.lookup_cols), Int64(kv.page_size),
        Int64(kv.page_stride), Int64(kv.slot_stride), Int64(kv.head_stride), Int32(1 if kv.paged else 0),
        Int32(1 if has_cache else 0), Int32(window), grid_dim=(T, Hq // hb, n_splits), block_dim=WARPS * WARP_SIZE,
    )


def attention_gpu[dtype: DType, D: Int](
    o: Ptr[dtype], q: Ptr[dtype], kv: KVView[dtype], offsets: Ptr[DType.uint32],
    cache_lens: Ptr[DType.uint32], has_cache: Bool, T: Int, B: Int, Hq: Int, Hkv: Int, ctx: DeviceContext,
    window: Int = 0,
) raises:
    """Launches the split kernel over (T, Hq / HB, S) blocks and, when S > 1, the merge over (T, Hq)."""
    comptime assert D % WARP_SIZE == 0 and D <= MAX_D, "GPU attention needs head_dim a multiple of the warp size, <= 256"
    var hb = heads_per_block(Hq // Hkv)
    var n_splits = max(1, min(MAX_SPLITS, ceil_div(TARGET_BLOCKS, T * (Hq // hb))))
    if n_splits == 1:
        # No workspace: the blocks write o. (ws is never read then; o's address stands in for it.)
        _launch_split[dtype, D](o, rebind[Ptr[F32]](o), q, kv, offsets, cache_lens, has_cache, T, B, Hq, Hkv, hb, 1, ctx, window)
        return
    # ws: [T, Hq, S, D + 2] fp32 partials, released in stream order after the merge is enqueued.
    var ws = ctx.enqueue_create_buffer[F32](T * Hq * n_splits * (D + 2))
    var ws_ptr = rebind[Ptr[F32]](ws.unsafe_ptr())
    _launch_split[dtype, D](o, ws_ptr, q, kv, offsets, cache_lens, has_cache, T, B, Hq, Hkv, hb, n_splits, ctx, window)
    ctx.enqueue_function[_attention_merge_kernel[dtype, D]](
        o, ws_ptr, Int32(Hq), Int32(n_splits), grid_dim=(T, Hq), block_dim=D,
    )
    _ = ws^
