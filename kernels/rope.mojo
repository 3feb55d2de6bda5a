# crucible.rope: rotary position embedding of a ragged batch, in the two layouts Llama weights come in.
#
# Parameters:
#   interleaved  False: pairs (i, i + D/2), the Hugging Face Llama/Qwen2 layout (rotate_half).
#                True:  pairs (2i, 2i + 1), the layout of GGUF Llama q/k weights, which llama.cpp's
#                converter permutes; using it avoids un-permuting quantized weight rows at load.
# Token t of sequence b sits at position start_pos[b] + (t - row_offsets[b]) (start_pos = tokens already
# in the KV cache). The angle pos * inv_freq[i] and its cos/sin are computed in fp32, as transformers
# does; inv_freq carries rope_theta and any frequency scaling.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu import global_idx
from max.gpu.host import DeviceContext
from std.math import cos, sin

from .common import F32, Ptr, ceil_div, cpu_threads, parallel_for


@always_inline
def sequence_of(t: Int, offsets: Ptr[DType.uint32], B: Int) -> Int:
    """The sequence b of ragged token t: binary search for offsets[b] <= t < offsets[b + 1]."""
    var lo = 0
    var hi = B - 1
    while lo < hi:
        var mid = (lo + hi + 1) // 2
        if Int(offsets[unsafe_offset=mid]) <= t:
            lo = mid
        else:
            hi = mid - 1
    return lo


@always_inline
def position_of(t: Int, offsets: Ptr[DType.uint32], start: Ptr[DType.uint32], B: Int) -> Int:
    """Position of ragged token t in its sequence, counting the start[b] tokens already cached."""
    var b = sequence_of(t, offsets, B)
    return Int(start[unsafe_offset=b]) + t - Int(offsets[unsafe_offset=b])


# CPU: the angles' cos and sin are computed once per token as vectors of RW pairs and applied to every
# head with vector loads; the interleaved layout de-interleaves a head's 2 RW values into the two
# halves of its pairs (scalar libm cos/sin per pair made the op slower than MAX's). head_dim with
# D / 2 a multiple of RW up to 2 * ROPE_MAX_HALF (64 and 128) take this path; other head dims rotate
# pair by pair, with cos and sin per pair and head (no model we load has one).
comptime RW = 16
comptime ROPE_MAX_HALF = 64
comptime RopeVecs = Array[SIMD[F32, RW], ROPE_MAX_HALF // RW]


@always_inline
def rope_vectorized(D: Int) -> Bool:
    var half = D // 2
    return half % RW == 0 and half <= ROPE_MAX_HALF


@always_inline
def _pair_index[interleaved: Bool](i: Int, D: Int) -> Tuple[Int, Int]:
    comptime if interleaved:
        return (2 * i, 2 * i + 1)
    else:
        return (i, i + D // 2)


@always_inline
def rotate_pair[dtype: DType, interleaved: Bool](
    dst: Ptr[dtype], src: Ptr[dtype], i: Int, D: Int, c: Float32, s: Float32
):
    """Pair i of one head by the angle with cosine c and sine s; src and dst point at the head's D values."""
    var p = _pair_index[interleaved](i, D)
    var x1 = src[unsafe_offset=p[0]].cast[F32]()
    var x2 = src[unsafe_offset=p[1]].cast[F32]()
    dst[unsafe_offset=p[0]] = (x1 * c - x2 * s).cast[dtype]()
    dst[unsafe_offset=p[1]] = (x2 * c + x1 * s).cast[dtype]()


@always_inline
def rope_angles(pos: Float32, inv_freq: Ptr[F32], D: Int, mut c: RopeVecs, mut s: RopeVecs):
    """Sets c, s = cos, sin of pos * inv_freq[0:D/2], for rope_head_cpu (nothing to do unless rope_vectorized(D))."""
    if not rope_vectorized(D):
        return
    for v in range(D // 2 // RW):
        var angle = pos * inv_freq.unsafe_load[width=RW](v * RW)
        c[v] = cos(angle)
        s[v] = sin(angle)


@always_inline
def rope_head_cpu[interleaved: Bool](
    dst: Ptr[F32], src: Ptr[F32], c: RopeVecs, s: RopeVecs, pos: Float32, inv_freq: Ptr[F32], D: Int
):
    """One head's D values at position pos, rotated with the angles of rope_angles(pos, ...)."""
    var half = D // 2
    if not rope_vectorized(D):
        for i in range(half):
            var angle = pos * inv_freq[unsafe_offset=i]
            rotate_pair[F32, interleaved](dst, src, i, D, cos(angle), sin(angle))
        return
    for v in range(half // RW):
        comptime if interleaved:
            var pairs = src.unsafe_load[width=2 * RW](2 * v * RW).deinterleave()
            var y1 = pairs[0] * c[v] - pairs[1] * s[v]
            var y2 = pairs[1] * c[v] + pairs[0] * s[v]
            dst.unsafe_store(2 * v * RW, y1.interleave(y2))
        else:
            var x1 = src.unsafe_load[width=RW](v * RW)
            var x2 = src.unsafe_load[width=RW](half + v * RW)
            dst.unsafe_store(v * RW, x1 * c[v] - x2 * s[v])
            dst.unsafe_store(half + v * RW, x2 * c[v] + x1 * s[v])


def _rope_kernel[dtype: DType, interleaved: Bool](
    y: Ptr[dtype], x: Ptr[dtype], inv_freq: Ptr[F32], offsets: Ptr[DType.uint32],
    start: Ptr[DType.uint32], T: Int32, heads: Int32, D: Int32, B: Int32,
):
    # One thread per (token, head, pair).
    var half = Int(D) // 2
    var idx = Int(global_idx.x)
    if idx >= Int(T) * Int(heads) * half:
        return
    var i = idx % half
    var th = idx // half
    var t = th // Int(heads)
    var pos = position_of(t, offsets, start, Int(B))
    var angle = Float32(pos) * inv_freq[unsafe_offset=i]
    var base = th * Int(D)
    rotate_pair[dtype, interleaved](y.unsafe_offset(base), x.unsafe_offset(base), i, Int(D), cos(angle), sin(angle))


@extensibility.register("crucible.rope")
struct Rope:
    @staticmethod
    def execute[target: StaticString, interleaved: Bool](
        y: OutputTensor[rank=3, ...],
        x: InputTensor[dtype=y.dtype, rank=3, ...],
        inv_freq: InputTensor[dtype=F32, rank=1, ...],
        row_offsets: InputTensor[dtype=DType.uint32, rank=1, ...],
        start_pos: InputTensor[dtype=DType.uint32, rank=1, ...],
        ctx: DeviceContext,
    ) raises:
        var T = x.dim_size(0)
        var heads = x.dim_size(1)
        var D = x.dim_size(2)
        var B = start_pos.dim_size(0)
        if D % 2 != 0 or inv_freq.dim_size(0) != D // 2:
            raise Error("crucible.rope: head_dim ", D, " needs ", D // 2, " inverse frequencies, got ",
                        inv_freq.dim_size(0))
        if row_offsets.dim_size(0) != B + 1:
            raise Error("crucible.rope: row_offsets must have batch + 1 = ", B + 1, " entries")
        if T == 0:
            return
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.rope on CPU computes in float32"
            var yp = rebind[Ptr[F32]](y.unsafe_ptr())
            var xp = rebind[Ptr[F32]](x.unsafe_ptr())
            var fp = rebind[Ptr[F32]](inv_freq.unsafe_ptr())
            var op = rebind[Ptr[DType.uint32]](row_offsets.unsafe_ptr())
            var sp = rebind[Ptr[DType.uint32]](start_pos.unsafe_ptr())
            if Int(op[unsafe_offset=B]) != T:
                raise Error("crucible.rope: row_offsets end at ", Int(op[unsafe_offset=B]), " but there are ", T, " tokens")
            var tasks = 1 if T * heads * D < 65536 else cpu_threads()
            var per = ceil_div(T, tasks)

            def tokens(task: Int) {var yp, var xp, var fp, var op, var sp, var T, var heads, var D, var B, var per}:
                var c = RopeVecs(fill=SIMD[F32, RW](0))
                var s = RopeVecs(fill=SIMD[F32, RW](0))
                for t in range(task * per, min(T, (task + 1) * per)):
                    var pos = Float32(position_of(t, op, sp, B))
                    rope_angles(pos, fp, D, c, s)
                    for h in range(heads):
                        var base = (t * heads + h) * D
                        rope_head_cpu[interleaved](yp.unsafe_offset(base), xp.unsafe_offset(base), c, s, pos, fp, D)

            if tasks == 1:
                tokens(0)
            else:
                parallel_for(tokens, tasks, ctx)
        else:
            var n = T * heads * (D // 2)
            ctx.enqueue_function[_rope_kernel[y.dtype, interleaved]](
                y.unsafe_ptr(), x.unsafe_ptr(), rebind[Ptr[F32]](inv_freq.unsafe_ptr()),
                rebind[Ptr[DType.uint32]](row_offsets.unsafe_ptr()),
                rebind[Ptr[DType.uint32]](start_pos.unsafe_ptr()),
                Int32(T), Int32(heads), Int32(D), Int32(B), grid_dim=ceil_div(n, 256), block_dim=256,
            )
