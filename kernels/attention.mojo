# crucible.attention_ragged and crucible.attention_paged: causal grouped-query attention with online
# softmax and fp32 accumulation (attention_cpu.mojo, attention_gpu.mojo share the math and differ in
# where K/V come from, kv_layout.mojo).
#
#   attention_ragged  prefill of a ragged batch whose K/V are contiguous [T, Hkv, D] tensors (no cache)
#   attention_paged   new tokens attend to their sequence's cached K/V plus their own, read from MAX's
#                     paged KV cache (run crucible.kv_cache_write for the new rows first). Covers
#                     prefill (cache empty), prefill with history (chunked or continued) and decode.
# Parameter window: 0 (default) for causal attention over the whole prefix; W > 0 for a sliding window
# in which a query at position p sees keys p - W + 1 .. p (Gemma 3's local layers, as transformers and
# llama.cpp mask them). Compile-time, so a model's local and global layers are two instances of one op.
# Supported: n_heads a multiple of n_kv_heads; head_dim 64, 128 or 256; any sequence lengths, crossing pages.

import extensibility
from extensibility import InputTensor, IO, IOSpec, ManagedTensorSlice, OutputTensor
from max.gpu.host import DeviceContext

from .attention_cpu import attention_cpu
from .attention_gpu import attention_gpu
from .common import F32, Ptr
from .kv_layout import KVView

comptime MutableInputTensor = ManagedTensorSlice[io_spec=IOSpec[True, IO.Input](), ...]


def _dispatch_head_dim[dtype: DType, target: StaticString, window: Int](
    o: Ptr[dtype], q: Ptr[dtype], kv: KVView[dtype], offsets: Ptr[DType.uint32], cache_lens: Ptr[DType.uint32],
    has_cache: Bool, T: Int, B: Int, Hq: Int, Hkv: Int, D: Int, ctx: DeviceContext,
) raises:
    comptime assert window >= 0, "crucible.attention: window is 0 (none) or a positive number of positions"
    if Hkv == 0 or Hq % Hkv != 0:
        raise Error("crucible.attention: n_heads ", Hq, " must be a multiple of n_kv_heads ", Hkv)
    comptime for d in [64, 128, 256]:
        if D == d:
            comptime if target == "cpu":
                comptime assert dtype == F32, "crucible.attention on CPU computes in float32"
                attention_cpu[d](rebind[Ptr[F32]](o), rebind[Ptr[F32]](q), rebind[KVView[F32]](kv),
                                 offsets, cache_lens, has_cache, B, Hq, Hkv, ctx, window)
            else:
                attention_gpu[dtype, d](o, q, kv, offsets, cache_lens, has_cache, T, B, Hq, Hkv, ctx, window)
            return
    raise Error("crucible.attention: head_dim ", D, " is not supported (64, 128 or 256)")


@extensibility.register("crucible.attention_ragged")
struct AttentionRagged:
    @staticmethod
    def execute[target: StaticString, window: Int = 0](
        o: OutputTensor[rank=3, ...],
        q: InputTensor[dtype=o.dtype, rank=3, ...],
        k: InputTensor[dtype=o.dtype, rank=3, ...],
        v: InputTensor[dtype=o.dtype, rank=3, ...],
        row_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var T = q.dim_size(0)
        var Hq = q.dim_size(1)
        var D = q.dim_size(2)
        var Hkv = k.dim_size(1)
        var B = row_offsets.dim_size(0) - 1
        if k.dim_size(0) != T or v.dim_size(0) != T or v.dim_size(1) != Hkv or k.dim_size(2) != D or v.dim_size(2) != D:
            raise Error("crucible.attention_ragged: k and v must be [T=", T, ", Hkv, D=", D, "]")
        if T == 0 or B <= 0:
            return
        var offsets = rebind[Ptr[DType.uint32]](row_offsets.unsafe_ptr())
        comptime if target == "cpu":
            if Int(offsets[unsafe_offset=B]) != T or Int(offsets[unsafe_offset=0]) != 0:
                raise Error("crucible.attention_ragged: row_offsets must run from 0 to T=", T)
        var kv = KVView[o.dtype].ragged(k.unsafe_ptr(), v.unsafe_ptr(), Hkv, D)
        _dispatch_head_dim[o.dtype, target, window](o.unsafe_ptr(), q.unsafe_ptr(), kv, offsets, offsets, False,
                                            T, B, Hq, Hkv, D, ctx)


@extensibility.register("crucible.attention_paged")
struct AttentionPaged:
    @staticmethod
    def execute[target: StaticString, window: Int = 0](
        o: OutputTensor[rank=3, ...],
        q: InputTensor[dtype=o.dtype, rank=3, ...],
        kv_blocks: MutableInputTensor[dtype=o.dtype, rank=6, ...],
        row_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
        cache_lengths: InputTensor[dtype=DType.uint32, rank=1, ...],
        lookup_table: InputTensor[dtype=DType.uint32, rank=2, ...],
        layer: InputTensor[dtype=DType.uint32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var T = q.dim_size(0)
        var Hq = q.dim_size(1)
        var D = q.dim_size(2)
        var B = cache_lengths.dim_size(0)
        var Hkv = kv_blocks.dim_size(4)
        var page_size = kv_blocks.dim_size(3)
        var n_layers = kv_blocks.dim_size(2)
        var layer_idx = Int(rebind[Ptr[DType.uint32]](layer.unsafe_ptr())[unsafe_offset=0])
        if kv_blocks.dim_size(5) != D or kv_blocks.dim_size(1) != 2:
            raise Error("crucible.attention_paged: cache blocks must be [pages, 2, layers, page, Hkv, D=", D, "]")
        if layer_idx >= n_layers:
            raise Error("crucible.attention_paged: layer ", layer_idx, " of a ", n_layers, "-layer cache")
        if row_offsets.dim_size(0) != B + 1 or lookup_table.dim_size(0) != B:
            raise Error("crucible.attention_paged: row_offsets [B+1] and lookup_table [B, pages] must match B=", B)
        if T == 0 or B == 0:
            return
        var st = kv_blocks.strides()
        var base = kv_blocks.unsafe_ptr().unsafe_offset(layer_idx * st[2])
        var kv = KVView[o.dtype](
            base, base.unsafe_offset(st[1]), rebind[Ptr[DType.uint32]](lookup_table.unsafe_ptr()),
            lookup_table.dim_size(1), page_size, st[0], st[3], st[4], True,
        )
        var offsets = rebind[Ptr[DType.uint32]](row_offsets.unsafe_ptr())
        var lens = rebind[Ptr[DType.uint32]](cache_lengths.unsafe_ptr())
        comptime if target == "cpu":
            var pages = kv_blocks.dim_size(0)
            for b in range(B):
                var n_ctx = Int(lens[unsafe_offset=b]) + Int(offsets[unsafe_offset=b + 1]) - Int(offsets[unsafe_offset=b])
                if n_ctx > lookup_table.dim_size(1) * page_size:
                    raise Error("crucible.attention_paged: sequence ", b, " needs ", n_ctx, " cached tokens but its page table holds ", lookup_table.dim_size(1) * page_size)
                for p in range((n_ctx + page_size - 1) // page_size):
                    if Int(kv.lookup()[unsafe_offset=b * kv.lookup_cols + p]) >= pages:
                        raise Error("crucible.attention_paged: page id out of range for sequence ", b)
        _dispatch_head_dim[o.dtype, target, window](o.unsafe_ptr(), q.unsafe_ptr(), kv, offsets, lens, True,
                                            T, B, Hq, Hkv, D, ctx)
