# Instantiates every CPU kernel body whose code depends on the target's SIMD width, so that
# tests/kernels/test_cpu_targets.py can compile them for CPUs other than this host's (`mojo build
# --emit object --target-triple ... --target-cpu ...`): AVX-512 (16 float lanes), AVX2 (8), baseline
# x86-64 SSE2 and aarch64 NEON (4). Compile only; the conformance grid runs the same code on the host.
#
# Covered: matmul (gemv, GEMM with its panel transposes), qmatmul for every block format and both
# activation modes (float and int8 decode rows, block pairs, row pairs, decode-into-panel GEMM),
# attention (ragged prefill, and paged decode in slot order), the rmsnorm / fused add-rmsnorm rows,
# rope rows, the silu_mul vector, qmatmul2's two-weight split (cat and gated) and crucible.mlp's two
# phases (common.parallel_phases). Not covered: the ops' `execute` wrappers, whose CPU branches are
# FW-generic loops around these (they need MAX's tensor types, which only a graph provides).

from max.gpu.host import DeviceContext

from kernels.attention_cpu import attention_cpu
from kernels.common import BytePtr, F32, FW, Ptr, scratch
from kernels.kv_layout import KVView
from kernels.matmul_cpu import matmul_cpu
from kernels.qmatmul_cpu import qmatmul_cpu
from kernels.mlp import mlp_cpu
from kernels.qmatmul2 import qmatmul2_cpu
from kernels.quant import QBLOCK, block_bytes, block_values, has_q8_rows, row_bytes_of
from kernels.rmsnorm import _add_rms_row_cpu, _rms_row_cpu
from kernels.rope import RW, RopeVecs, rope_angles, rope_head_cpu
from kernels.silu_mul import gated_act


def _zeros(n: Int) -> Ptr[F32]:
    var p = scratch[F32](n)
    for i in range(n):
        p[unsafe_offset=i] = 0
    return p


def matmuls(ctx: DeviceContext) raises:
    # y: [M, N], x: [M, K], w: [N, K]; M = 1 (gemv) and 64 (GEMM).
    comptime K = 64
    comptime N = 48
    var x = _zeros(64 * K)
    var w = _zeros(N * K)
    var y = _zeros(64 * N)
    matmul_cpu["auto"](y, x, w, 1, N, K, ctx)
    matmul_cpu["gemv"](y, x, w, 3, N, K, ctx)
    matmul_cpu["gemm"](y, x, w, 64, N, K, ctx)
    x.unsafe_free()
    w.unsafe_free()
    y.unsafe_free()


def qmatmuls[qtype: StaticString](ctx: DeviceContext) raises:
    # Weights: [N, row bytes] of zero blocks; M = 1, 3 (row pairs) and 64 (GEMM). K: four 32-value
    # blocks, or one 256-value super-block.
    comptime K = 256 if block_values[qtype]() == 256 else 128
    comptime N = 16
    var bytes = N * row_bytes_of[qtype](K)
    var w = rebind[BytePtr](scratch[DType.uint8](bytes))
    for i in range(bytes):
        w[unsafe_offset=i] = 0
    var x = _zeros(64 * K)
    var y = _zeros(64 * 2 * N)
    for m in [1, 3, 64]:
        qmatmul_cpu[qtype, "f32"](y, x, w, m, N, K, ctx, N)
        comptime if has_q8_rows[qtype]():  # the formats with an int8-activation path
            qmatmul_cpu[qtype, "q8"](y, x, w, m, N, K, ctx, N)
        # crucible.qmatmul2: the weight beside itself, concatenated ([m, 2N] fits y) and gated.
        qmatmul2_cpu[qtype, qtype, "f32", "cat"](y, x, w, w, m, N, N, K, ctx)
        qmatmul2_cpu[qtype, qtype, "f32", "silu"](y, x, w, w, m, N, N, K, ctx)
    w.unsafe_free()
    x.unsafe_free()
    y.unsafe_free()


def mlps[qtype: StaticString](ctx: DeviceContext) raises:
    # crucible.mlp with H = I = 64 (gate, up and down share one [64, 64] weight of zero blocks): M = 1
    # (two phases) and 64 (the prefill path), float and int8 activations.
    comptime H = 64
    var bytes = H * (H // QBLOCK) * block_bytes[qtype]()
    var w = rebind[BytePtr](scratch[DType.uint8](bytes))
    for i in range(bytes):
        w[unsafe_offset=i] = 0
    var x = _zeros(64 * H)
    var y = _zeros(64 * H)
    for m in [1, 64]:
        mlp_cpu[qtype, qtype, qtype, "f32", "silu"](y, x, w, w, w, m, H, H, ctx)
        mlp_cpu[qtype, qtype, qtype, "q8", "gelu_tanh"](y, x, w, w, w, m, H, H, ctx)
    w.unsafe_free()
    x.unsafe_free()
    y.unsafe_free()


def attentions[D: Int](ctx: DeviceContext) raises:
    # One sequence of 5 new tokens, 4/2 heads: ragged K/V [5, 2, D]; then paged, 1 new token after
    # 20 cached, pages of 16 slots: kv_blocks [2 pages, 2, 1 layer, 16, 2, D].
    comptime HQ = 4
    comptime HKV = 2
    var q = _zeros(5 * HQ * D)
    var o = _zeros(5 * HQ * D)
    var k = _zeros(5 * HKV * D)
    var v = _zeros(5 * HKV * D)
    var offsets = scratch[DType.uint32](2)
    offsets[unsafe_offset=0] = 0
    offsets[unsafe_offset=1] = 5
    var lens = scratch[DType.uint32](1)
    lens[unsafe_offset=0] = 0
    attention_cpu[D](o, q, KVView[F32].ragged(k, v, HKV, D), offsets, lens, False, 1, HQ,
                     HKV, ctx)
    var page = KVView[F32].dense_page_elems(1, 16, HKV, D)
    var blocks = _zeros(2 * page)
    var lookup = scratch[DType.uint32](2)
    lookup[unsafe_offset=0] = 1
    lookup[unsafe_offset=1] = 0
    offsets[unsafe_offset=1] = 1
    lens[unsafe_offset=0] = 20
    var paged = KVView[F32].paged_dense(blocks, lookup, 2, 16, 1, 0, HKV, D)
    attention_cpu[D](o, q, paged, offsets, lens, True, 1, HQ, HKV, ctx)
    for p in [q, o, k, v, blocks]:
        p.unsafe_free()
    offsets.unsafe_free()
    lens.unsafe_free()
    lookup.unsafe_free()


def rows() raises:
    # rmsnorm rows of H = 37 (a vector body and a scalar tail), rope over one head of D = 64, silu_mul.
    comptime H = 37
    var s = _zeros(H)
    var y = _zeros(H)
    var h = _zeros(H)
    var w = _zeros(H)
    _rms_row_cpu(y, h, w, H, 1e-5)
    _add_rms_row_cpu(s, y, h, h, w, H, 1e-5)
    var inv_freq = _zeros(32)
    var head = _zeros(64)
    var c = RopeVecs(fill=SIMD[F32, RW](0))
    var sn = RopeVecs(fill=SIMD[F32, RW](0))
    rope_angles(3.0, inv_freq, 64, c, sn)
    rope_head_cpu[False](head, head, c, sn, 3.0, inv_freq, 64)
    rope_head_cpu[True](head, head, c, sn, 3.0, inv_freq, 64)
    head.unsafe_store(0, gated_act["silu", FW](head.unsafe_load[width=FW](0), head.unsafe_load[width=FW](FW)))
    head.unsafe_store(0, gated_act["gelu_tanh", FW](head.unsafe_load[width=FW](0), head.unsafe_load[width=FW](FW)))
    for p in [s, y, h, w, inv_freq, head]:
        p.unsafe_free()


def main() raises:
    var ctx = DeviceContext(api="cpu")
    matmuls(ctx)
    qmatmuls["q4_0"](ctx)
    qmatmuls["q4_1"](ctx)
    qmatmuls["q5_0"](ctx)
    qmatmuls["q8_0"](ctx)
    qmatmuls["f16"](ctx)
    qmatmuls["iq4_nl"](ctx)
    qmatmuls["iq4_xs"](ctx)
    mlps["q5_0"](ctx)
    attentions[64](ctx)
    attentions[128](ctx)
    rows()
