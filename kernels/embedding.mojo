# crucible.embedding: y[t, :] = dequant(table[ids[t], :]), decoding only the gathered rows, so a GGUF
# embedding (SmolLM2's is Q8_0 and doubles as the tied lm_head) stays quantized in memory.
#
# Parameters:
#   qtype  "f32" (table [V, H] float32) or "q4_0" | "q4_1" | "q8_0" | "f16" (table [V, bytes] uint8)
# Token ids outside [0, V) raise an error instead of reading out of bounds.

import extensibility
from extensibility import InputTensor, OutputTensor
from max.gpu import global_idx
from max.gpu.host import DeviceContext
from std.utils.numerics import nan

from .common import BytePtr, F32, Ptr, ceil_div
from .quant import HALF, QBLOCK, block_values, decode_chunk, decode_value, row_bytes_of


def _embedding_kernel[dtype: DType, qtype: StaticString](
    y: Ptr[dtype], ids: Ptr[DType.int64], table: BytePtr, T: Int32, H: Int32, V: Int64, row_bytes: Int64
):
    var idx = Int(global_idx.x)
    if idx >= Int(T) * Int(H):
        return
    var t = idx // Int(H)
    var i = idx % Int(H)
    var tok = Int(ids[unsafe_offset=t])
    if tok < 0 or tok >= Int(V):
        # Never read outside the table; a NaN row makes the bad id visible downstream.
        y[unsafe_offset=idx] = nan[dtype]()
        return
    var row = table.unsafe_offset(tok * Int(row_bytes))
    y[unsafe_offset=idx] = decode_value[qtype](row, i).cast[dtype]()


@extensibility.register("crucible.embedding")
struct Embedding:
    @staticmethod
    def execute[target: StaticString, qtype: StaticString](
        y: OutputTensor[rank=2, ...],
        ids: InputTensor[dtype=DType.int64, rank=1, ...],
        table: InputTensor[rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        var T = ids.dim_size(0)
        var H = y.dim_size(1)
        var V = table.dim_size(0)
        comptime elem_bytes = 4 if qtype == "f32" else 1
        var row_bytes = table.dim_size(1) * elem_bytes
        if qtype != "f32" and H % block_values[qtype]() != 0:
            raise Error("crucible.embedding[", qtype, "]: hidden size ", H, " is not a multiple of ", block_values[qtype]())
        if row_bytes != row_bytes_of[qtype](H) and not (qtype == "f32" and row_bytes == 4 * H):
            raise Error("crucible.embedding[", qtype, "]: table rows of ", row_bytes, " bytes do not hold ", H, " values")
        if T == 0:
            return
        var table_bytes = rebind[BytePtr](table.unsafe_ptr().unsafe_bitcast[UInt8]())
        comptime if target == "cpu":
            comptime assert y.dtype == F32, "crucible.embedding on CPU computes in float32"
            var yp = rebind[Ptr[F32]](y.unsafe_ptr())
            var idp = rebind[Ptr[DType.int64]](ids.unsafe_ptr())
            for t in range(T):
                var tok = Int(idp[unsafe_offset=t])
                if tok < 0 or tok >= V:
                    raise Error("crucible.embedding: token id ", tok, " outside the vocabulary [0, ", V, ")")
                var row = table_bytes.unsafe_offset(tok * row_bytes)
                var out = yp.unsafe_offset(t * H)
                comptime if qtype == "f32":
                    var src = row.unsafe_bitcast[Float32]()
                    for i in range(H):
                        out[unsafe_offset=i] = src[unsafe_offset=i]
                else:
                    for b in range(H // QBLOCK):
                        var v = decode_chunk[qtype](row, b)
                        out.unsafe_offset(b * QBLOCK).unsafe_store(0, v[0])
                        out.unsafe_offset(b * QBLOCK + HALF).unsafe_store(0, v[1])
        else:
            # Checking ids on the host would need a device-to-host copy per step: the kernel writes NaN
            # rows for ids outside the vocabulary instead (tokenizers never produce them).
            ctx.enqueue_function[_embedding_kernel[y.dtype, qtype]](
                y.unsafe_ptr(), rebind[Ptr[DType.int64]](ids.unsafe_ptr()), table_bytes, Int32(T), Int32(H),
                Int64(V), Int64(row_bytes), grid_dim=ceil_div(T * H, 256), block_dim=256,
            )
