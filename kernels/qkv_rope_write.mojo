# crucible.qkv_rope_write: the step between a Llama layer's fused qkv projection and its attention,
# as one op. From qkv [T, (Hq + 2 Hkv) D] (q heads, then k heads, then v heads, per token) it
#   - returns q [T, Hq, D] with rope applied,
#   - writes k (rope applied) and v into MAX's paged KV cache, as crucible.kv_cache_write does.
# Unfused this is split + rope(q) + rope(k) + kv_cache_write: four kernel launches per layer, each
# with a fixed cost that dominates on the CPU, where a decode step has 1 token of work per launch.
#
# Parameters:
#   interleaved  the rope layout, as crucible.rope: False pairs (i, i + D/2), True pairs (2i, 2i + 1).
# Token t of sequence b sits at position j = cache_lengths[b] + (t - row_offsets[b]): rope angle
# j * inv_freq[i] (fp32, as crucible.rope) and cache slot j (page lookup[b, j // page_size]).
# The rope math (rope.mojo's vector helpers on the CPU) and the cache addressing (kv_layout.mojo) are
# the unfused ops' own.

import extensibility
from extensibility import InputTensor, IO, IOSpec, ManagedTensorSlice, OutputTensor
from max.gpu import global_idx
from max.gpu.host import DeviceContext
from std.math import cos, sin

from .common import F32, Ptr, ceil_div, cpu_threads, parallel_for
from .kv_cache import check_cache_room
from .kv_layout import KVView
from .rope import RW, RopeVecs, _pair_index, rope_angles, rope_head_cpu, rotate_pair, sequence_of

comptime MutableInputTensor = ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), ...]


def _qkv_kernel[dtype: DType, interleaved: Bool](
    q_out: Ptr[dtype], qkv: Ptr[dtype], k_base: Ptr[dtype], v_base: Ptr[dtype], inv_freq: Ptr[F32],
    lookup: Ptr[DType.uint32], offsets: Ptr[DType.uint32], lens: Ptr[DType.uint32], T: Int32, Hq: Int32,
    Hkv: Int32, D: Int32, B: Int32, lookup_cols: Int64, page_size: Int64, page_stride: Int64,
    slot_stride: Int64, head_stride: Int64,
):
    # One thread per (token, head of q | k | v, pair).
    var kv = KVView[dtype](k_base, v_base, lookup, Int(lookup_cols), Int(page_size), Int(page_stride),
                           Int(slot_stride), Int(head_stride), True)
    var d = Int(D)
    var half = d // 2
    var hq = Int(Hq)
    var hkv = Int(Hkv)
    var heads = hq + 2 * hkv
    var idx = Int(global_idx.x)
    if idx >= Int(T) * heads * half:
        return
    var i = idx % half
    var head = (idx // half) % heads
    var t = idx // (half * heads)
    var b = sequence_of(t, offsets, Int(B))
    var j = Int(lens[unsafe_offset=b]) + t - Int(offsets[unsafe_offset=b])
    var src = qkv.unsafe_offset((t * heads + head) * d)
    if head < hq + hkv:
        var angle = Float32(j) * inv_freq[unsafe_offset=i]
        var dst = q_out.unsafe_offset((t * hq + head) * d) if head < hq else kv.key(b, 0, j, head - hq)
        rotate_pair[dtype, interleaved](dst, src, i, d, cos(angle), sin(angle))
    else:
        var p = _pair_index[interleaved](i, d)
        var dst = kv.value(b, 0, j, head - hq - hkv)
        dst[unsafe_offset=p[0]] = src[unsafe_offset=p[0]]
        dst[unsafe_offset=p[1]] = src[unsafe_offset=p[1]]


@extensibility.register("crucible.qkv_rope_write")
struct QKVRopeWrite:
    @staticmethod
    def execute[target: StaticString, interleaved: Bool](
        q: OutputTensor[rank=3, ...],
        qkv: InputTensor[dtype=q.dtype, rank=2, ...],
        kv_blocks: MutableInputTensor[dtype=q.dtype, rank=6, ...],
        inv_freq: InputTensor[dtype=F32, rank=1, ...],
        row_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
        cache_lengths: InputTensor[dtype=DType.uint32, rank=1, ...],
        lookup_table: InputTensor[dtype=DType.uint32, rank=2, ...],
        layer: InputTensor[dtype=DType.uint32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        # q: [T, Hq, D]; qkv: [T, (Hq + 2 Hkv) D]; kv_blocks: [pages, 2, layers, page_size, Hkv, D].
        var T = q.dim_size(0)
        var Hq = q.dim_size(1)
        var D = q.dim_size(2)
        var Hkv = kv_blocks.dim_size(4)
        var B = cache_lengths.dim_size(0)
        var page_size = kv_blocks.dim_size(3)
        var layer_idx = Int(rebind[Ptr[DType.uint32]](layer.unsafe_ptr())[unsafe_offset=0])
        if kv_blocks.dim_size(5) != D or kv_blocks.dim_size(1) != 2:
            raise Error("crucible.qkv_rope_write: cache blocks must be [pages, 2, layers, page, Hkv, D=", D, "]")
        if qkv.dim_size(0) != T or qkv.dim_size(1) != (Hq + 2 * Hkv) * D:
            raise Error("crucible.qkv_rope_write: qkv is [", qkv.dim_size(0), ", ", qkv.dim_size(1), "], expected [",
                        T, ", (Hq=", Hq, " + 2 Hkv=", 2 * Hkv, ") * D=", D, "]")
        if D % 2 != 0 or inv_freq.dim_size(0) != D // 2:
            raise Error("crucible.qkv_rope_write: head_dim ", D, " needs ", D // 2, " inverse frequencies, got ",
                        inv_freq.dim_size(0))
        if layer_idx >= kv_blocks.dim_size(2):
            raise Error("crucible.qkv_rope_write: layer ", layer_idx, " of a ", kv_blocks.dim_size(2), "-layer cache")
        if row_offsets.dim_size(0) != B + 1 or lookup_table.dim_size(0) != B:
            raise Error("crucible.qkv_rope_write: row_offsets [B+1] and lookup_table [B, pages] must match B=", B)
        if T == 0 or B == 0:
            return
        var st = kv_blocks.strides()
        var base = kv_blocks.unsafe_ptr().unsafe_offset(layer_idx * st[2])
        var lookup = rebind[Ptr[DType.uint32]](lookup_table.unsafe_ptr())
        var offsets = rebind[Ptr[DType.uint32]](row_offsets.unsafe_ptr())
        var lens = rebind[Ptr[DType.uint32]](cache_lengths.unsafe_ptr())
        var freqs = rebind[Ptr[F32]](inv_freq.unsafe_ptr())
        var cols = lookup_table.dim_size(1)
        comptime if target == "cpu":
            comptime assert q.dtype == F32, "crucible.qkv_rope_write on CPU computes in float32"
            var kv = KVView[F32](rebind[Ptr[F32]](base), rebind[Ptr[F32]](base.unsafe_offset(st[1])), lookup, cols,
                                 page_size, st[0], st[3], st[4], True)
            check_cache_room("crucible.qkv_rope_write", offsets, lens, lookup, B, T, cols, page_size,
                             kv_blocks.dim_size(0))
            var qp = rebind[Ptr[F32]](q.unsafe_ptr())
            var xp = rebind[Ptr[F32]](qkv.unsafe_ptr())
            var heads = Hq + 2 * Hkv
            var tasks = 1 if T * heads * D < 65536 else cpu_threads()
            var per = ceil_div(T, tasks)

            def tokens(task: Int) {var qp, var xp, var kv, var freqs, var offsets, var lens, var T, var Hq, var Hkv,
                                   var D, var B, var heads, var per}:
                var cv = RopeVecs(fill=SIMD[F32, RW](0))
                var sv = RopeVecs(fill=SIMD[F32, RW](0))
                for t in range(task * per, min(T, (task + 1) * per)):
                    var b = sequence_of(t, offsets, B)
                    var j = Int(lens[unsafe_offset=b]) + t - Int(offsets[unsafe_offset=b])
                    var s0 = Int(offsets[unsafe_offset=b])
                    var row = xp.unsafe_offset(t * heads * D)
                    var pos = Float32(j)
                    rope_angles(pos, freqs, D, cv, sv)
                    for h in range(Hq):
                        rope_head_cpu[interleaved](qp.unsafe_offset((t * Hq + h) * D), row.unsafe_offset(h * D),
                                                   cv, sv, pos, freqs, D)
                    for g in range(Hkv):
                        rope_head_cpu[interleaved](kv.key(b, s0, j, g), row.unsafe_offset((Hq + g) * D), cv, sv, pos,
                                                   freqs, D)
                    for g in range(Hkv):
                        var src = row.unsafe_offset((Hq + Hkv + g) * D)
                        var dst = kv.value(b, s0, j, g)
                        for e in range(D):
                            dst[unsafe_offset=e] = src[unsafe_offset=e]

            if tasks == 1:
                tokens(0)
            else:
                parallel_for(tokens, tasks, ctx)
        else:
            var n = T * (Hq + 2 * Hkv) * (D // 2)
            ctx.enqueue_function[_qkv_kernel[q.dtype, interleaved]](
                q.unsafe_ptr(), qkv.unsafe_ptr(), base, base.unsafe_offset(st[1]), freqs, lookup, offsets, lens,
                Int32(T), Int32(Hq), Int32(Hkv), Int32(D), Int32(B), Int64(cols), Int64(page_size), Int64(st[0]),
                Int64(st[3]), Int64(st[4]), grid_dim=ceil_div(n, 256), block_dim=256,
            )
