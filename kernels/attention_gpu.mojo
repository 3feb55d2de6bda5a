# GPU causal GQA attention with online softmax (fp32 statistics and accumulation), for the same K/V
# sources as the CPU path (kv_layout.mojo).
#
# One block of 4 warps per (query token, query head). Warp w takes key chunks w, w + 4, ... of WARP_SIZE
# keys: lane l scores key (chunk * WARP_SIZE + l) against q (staged in shared memory), the warp updates its running
# max / denominator, and each lane accumulates D / WARP_SIZE output dims of P @ V with the probabilities
# broadcast by shuffles (V reads are coalesced along D). The four warps' partial states are merged
# through shared memory at the end. A straightforward, correct baseline for decode and prefill.

from std.math import exp, sqrt
from std.memory import stack_allocation
from max.gpu import WARP_SIZE, barrier, block_idx, lane_id, thread_idx
from max.gpu.host import DeviceContext
from max.gpu.memory import AddressSpace
from max.gpu.primitives.warp import max as warp_max, shuffle_idx, sum as warp_sum

from .common import F32, Ptr
from .kv_layout import KVView
from .rope import sequence_of

comptime WARPS = 4
comptime MAX_D = 256
comptime NEG_INF = Float32(-3.0e38)


def _attention_kernel[dtype: DType, D: Int](
    o: Ptr[dtype], q: Ptr[dtype], k_base: Ptr[dtype], v_base: Ptr[dtype], lookup: Ptr[DType.uint32],
    offsets: Ptr[DType.uint32], cache_lens: Ptr[DType.uint32], B: Int32, Hq: Int32, Hkv: Int32,
    lookup_cols: Int64, page_size: Int64, page_stride: Int64, slot_stride: Int64, head_stride: Int64,
    paged: Int32, has_cache: Int32,
):
    comptime PER_LANE = D // WARP_SIZE
    comptime WS = WARP_SIZE
    var kv = KVView[dtype](k_base, v_base, lookup, Int(lookup_cols), Int(page_size), Int(page_stride),
                           Int(slot_stride), Int(head_stride), paged != 0)
    var t = Int(block_idx.x)
    var h = Int(block_idx.y)
    var tid = Int(thread_idx.x)
    var lane = Int(lane_id())
    var w = tid // WS
    var hq = Int(Hq)
    var g = h // (hq // Int(Hkv))
    var b = sequence_of(t, offsets, Int(B))
    var seq_start = Int(offsets[unsafe_offset=b])
    var pos = (Int(cache_lens[unsafe_offset=b]) if has_cache != 0 else 0) + t - seq_start
    var scale = Float32(1.0) / sqrt(Float32(D))

    var qs = stack_allocation[D, Float32, address_space=AddressSpace.SHARED]()
    var part = stack_allocation[WARPS * (D + 2), Float32, address_space=AddressSpace.SHARED]()
    var i = tid
    while i < D:
        qs[unsafe_offset=i] = q[unsafe_offset=(t * hq + h) * D + i].cast[F32]()
        i += WARPS * WS
    barrier()

    var m = NEG_INF
    var l = Float32(0)
    var acc = Array[Float32, PER_LANE](fill=0)
    var chunk = w
    while chunk * WS <= pos:
        var j = chunk * WS + lane
        var s = NEG_INF
        if j <= pos:
            var kp = kv.key(b, seq_start, j, g)
            var dot = Float32(0)
            for d in range(D):
                dot += qs[unsafe_offset=d] * kp[unsafe_offset=d].cast[F32]()
            s = dot * scale
        var m_new = max(m, warp_max(s))
        var p = exp(s - m_new) if j <= pos else Float32(0)
        var alpha = exp(m - m_new)
        l = l * alpha + warp_sum(p)
        comptime for e in range(PER_LANE):
            acc[e] *= alpha
        var n_valid = min(WS, pos + 1 - chunk * WS)
        for src in range(WS):
            var ps = shuffle_idx(p, UInt32(src))
            if src < n_valid:
                var vp = kv.value(b, seq_start, chunk * WS + src, g)
                comptime for e in range(PER_LANE):
                    acc[e] += ps * vp[unsafe_offset=lane + WS * e].cast[F32]()
        m = m_new
        chunk += WARPS

    # Merge the warps: part[w] = (m, l, acc[0..D)).
    var mine = part.unsafe_offset(w * (D + 2))
    if lane == 0:
        mine[unsafe_offset=0] = m
        mine[unsafe_offset=1] = l
    comptime for e in range(PER_LANE):
        mine[unsafe_offset=2 + lane + WS * e] = acc[e]
    barrier()
    i = tid
    while i < D:
        var m_all = NEG_INF
        for ww in range(WARPS):
            m_all = max(m_all, part[unsafe_offset=ww * (D + 2)])
        var l_all = Float32(0)
        var o_all = Float32(0)
        for ww in range(WARPS):
            var lw = part[unsafe_offset=ww * (D + 2) + 1]
            if lw > 0:
                var f = exp(part[unsafe_offset=ww * (D + 2)] - m_all)
                l_all += lw * f
                o_all += part[unsafe_offset=ww * (D + 2) + 2 + i] * f
        o[unsafe_offset=(t * hq + h) * D + i] = (o_all / l_all).cast[dtype]()
        i += WARPS * WS


def attention_gpu[dtype: DType, D: Int](
    o: Ptr[dtype], q: Ptr[dtype], kv: KVView[dtype], offsets: Ptr[DType.uint32],
    cache_lens: Ptr[DType.uint32], has_cache: Bool, T: Int, B: Int, Hq: Int, Hkv: Int, ctx: DeviceContext,
) raises:
    """Launches one block per (token, query head)."""
    comptime assert D % WARP_SIZE == 0 and D <= MAX_D, "GPU attention needs head_dim a multiple of the warp size, <= 256"
    ctx.enqueue_function[_attention_kernel[dtype, D]](
        o, q, kv.base(), kv.v_base(), kv.lookup(), offsets, cache_lens, Int32(B), Int32(Hq), Int32(Hkv),
        Int64(kv.lookup_cols), Int64(kv.page_size), Int64(kv.page_stride), Int64(kv.slot_stride),
        Int64(kv.head_stride), Int32(1 if kv.paged else 0), Int32(1 if has_cache else 0),
        grid_dim=(T, Hq), block_dim=WARPS * WARP_SIZE,
    )
