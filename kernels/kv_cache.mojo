# crucible.kv_cache_write: stores the new K/V rows of a ragged batch into MAX's paged KV cache.
#
# Token t of sequence b (ragged row t, offsets[b] <= t < offsets[b + 1]) is the sequence's token
# j = cache_lengths[b] + (t - offsets[b]); its rows go to page lookup[b, j // page_size], slot
# j % page_size, of the given layer. The buffer is [pages, 2, layers, page_size, Hkv, D] with K at
# index 0 and V at 1 of dim 1 (MAX's PagedKVCacheManager layout), addressed through its strides.

import extensibility
from extensibility import InputTensor, IO, IOSpec, ManagedTensorSlice
from max.gpu import global_idx
from max.gpu.host import DeviceContext

from .common import Ptr, ceil_div
from .kv_layout import KVView
from .rope import sequence_of

comptime MutableInputTensor = ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), ...]


def check_cache_room(
    op: StaticString, offsets: Ptr[DType.uint32], lens: Ptr[DType.uint32], lookup: Ptr[DType.uint32],
    B: Int, T: Int, cols: Int, page_size: Int, pages: Int,
) raises:
    """CPU check before writing new rows: the offsets cover the T tokens, and every sequence's new
    rows land in pages its page table holds, with page ids inside the cache."""
    if Int(offsets[unsafe_offset=B]) != T:
        raise Error(op, ": row_offsets end at ", Int(offsets[unsafe_offset=B]), ", not T=", T)
    for b in range(B):
        var n_new = Int(offsets[unsafe_offset=b + 1]) - Int(offsets[unsafe_offset=b])
        var start = Int(lens[unsafe_offset=b])
        if start + n_new > cols * page_size:
            raise Error(op, ": sequence ", b, " would hold ", start + n_new,
                        " tokens but its page table has room for ", cols * page_size)
        if n_new > 0:
            for p in range(start // page_size, (start + n_new - 1) // page_size + 1):
                if Int(lookup[unsafe_offset=b * cols + p]) >= pages:
                    raise Error(op, ": page id out of range for sequence ", b)


def _write_kernel[dtype: DType](
    k_base: Ptr[dtype], v_base: Ptr[dtype], k: Ptr[dtype], v: Ptr[dtype], lookup: Ptr[DType.uint32],
    offsets: Ptr[DType.uint32], lens: Ptr[DType.uint32], T: Int32, Hkv: Int32, D: Int32, B: Int32,
    lookup_cols: Int64, page_size: Int64, page_stride: Int64, slot_stride: Int64, head_stride: Int64,
):
    var kv = KVView[dtype](k_base, v_base, lookup, Int(lookup_cols), Int(page_size), Int(page_stride),
                           Int(slot_stride), Int(head_stride), True)
    var idx = Int(global_idx.x)
    var d_ = Int(D)
    var h_ = Int(Hkv)
    if idx >= Int(T) * h_ * d_:
        return
    var d = idx % d_
    var g = (idx // d_) % h_
    var t = idx // (d_ * h_)
    var b = sequence_of(t, offsets, Int(B))
    var j = Int(lens[unsafe_offset=b]) + t - Int(offsets[unsafe_offset=b])
    kv.key(b, 0, j, g)[unsafe_offset=d] = k[unsafe_offset=idx]
    kv.value(b, 0, j, g)[unsafe_offset=d] = v[unsafe_offset=idx]


@extensibility.register("crucible.kv_cache_write")
struct KVCacheWrite:
    @staticmethod
    def execute[target: StaticString](
        kv_blocks: MutableInputTensor[rank=6, ...],
        k: InputTensor[dtype=kv_blocks.dtype, rank=3, ...],
        v: InputTensor[dtype=kv_blocks.dtype, rank=3, ...],
        row_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
        cache_lengths: InputTensor[dtype=DType.uint32, rank=1, ...],
        lookup_table: InputTensor[dtype=DType.uint32, rank=2, ...],
        layer: InputTensor[dtype=DType.uint32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var T = k.dim_size(0)
        var Hkv = k.dim_size(1)
        var D = k.dim_size(2)
        var B = cache_lengths.dim_size(0)
        var page_size = kv_blocks.dim_size(3)
        var layer_idx = Int(rebind[Ptr[DType.uint32]](layer.unsafe_ptr())[unsafe_offset=0])
        if kv_blocks.dim_size(4) != Hkv or kv_blocks.dim_size(5) != D or kv_blocks.dim_size(1) != 2:
            raise Error("crucible.kv_cache_write: cache blocks [pages, 2, layers, page, ", kv_blocks.dim_size(4),
                        ", ", kv_blocks.dim_size(5), "] do not hold rows of [", Hkv, ", ", D, "]")
        if layer_idx >= kv_blocks.dim_size(2):
            raise Error("crucible.kv_cache_write: layer ", layer_idx, " of a ", kv_blocks.dim_size(2), "-layer cache")
        if v.dim_size(0) != T or v.dim_size(1) != Hkv or v.dim_size(2) != D:
            raise Error("crucible.kv_cache_write: k and v shapes differ")
        if T == 0 or B == 0:
            return
        var st = kv_blocks.strides()
        var base = kv_blocks.unsafe_ptr().unsafe_offset(layer_idx * st[2])
        var lookup = rebind[Ptr[DType.uint32]](lookup_table.unsafe_ptr())
        var offsets = rebind[Ptr[DType.uint32]](row_offsets.unsafe_ptr())
        var lens = rebind[Ptr[DType.uint32]](cache_lengths.unsafe_ptr())
        var cols = lookup_table.dim_size(1)
        comptime if target == "cpu":
            var kv = KVView[kv_blocks.dtype](base, base.unsafe_offset(st[1]), lookup, cols, page_size,
                                             st[0], st[3], st[4], True)
            var kp = k.unsafe_ptr()
            var vp = v.unsafe_ptr()
            check_cache_room("crucible.kv_cache_write", offsets, lens, lookup, B, T, cols, page_size,
                             kv_blocks.dim_size(0))
            for b in range(B):
                var s0 = Int(offsets[unsafe_offset=b])
                var s1 = Int(offsets[unsafe_offset=b + 1])
                var start = Int(lens[unsafe_offset=b])
                for t in range(s0, s1):
                    var j = start + t - s0
                    for g in range(Hkv):
                        var kd = kv.key(b, s0, j, g)
                        var vd = kv.value(b, s0, j, g)
                        var src = (t * Hkv + g) * D
                        for d in range(D):
                            kd[unsafe_offset=d] = kp[unsafe_offset=src + d]
                            vd[unsafe_offset=d] = vp[unsafe_offset=src + d]
        else:
            ctx.enqueue_function[_write_kernel[kv_blocks.dtype]](
                base, base.unsafe_offset(st[1]), k.unsafe_ptr(), v.unsafe_ptr(), lookup, offsets, lens,
                Int32(T), Int32(Hkv), Int32(D), Int32(B), Int64(cols), Int64(page_size), Int64(st[0]),
                Int64(st[3]), Int64(st[4]), grid_dim=ceil_div(T * Hkv * D, 256), block_dim=256,
            )
