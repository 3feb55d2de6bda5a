"""Graph-building wrappers for Crucible's Mojo custom ops (``kernels/``).

Each function adds one ``crucible.*`` custom op to the current ``max.graph.Graph`` with its output
type worked out from the inputs, so model code reads like math. The graph must be created with
``custom_extensions=[kernel_package().path]``.

Shapes use the names of the op headers: ``T`` tokens of a ragged batch, ``B`` sequences, ``H`` hidden,
``Hq``/``Hkv`` query/key-value heads, ``D`` head_dim, ``I`` MLP width.
"""

from __future__ import annotations

from typing import Literal

from max.dtype import DType
from max.graph import BufferValue, DeviceRef, TensorType, TensorValue, ops

# GGUF block formats our qmatmul/embedding read byte for byte: (block elements, bytes per block).
QUANT_BLOCKS: dict[str, tuple[int, int]] = {
    "q4_0": (32, 18),   # f16 d, 16 bytes of nibbles: x = d * (q - 8)
    "q4_1": (32, 20),   # f16 d, f16 m, 16 bytes of nibbles: x = d * q + m
    "q5_0": (32, 22),   # f16 d, 4 bytes of fifth bits, 16 bytes of nibbles: x = d * (q - 16)
    "q5_1": (32, 24),   # f16 d, f16 m, fifth bits, nibbles: x = d * q + m
    "q8_0": (32, 34),   # f16 d, 32 int8: x = d * q
    "q2_k": (256, 84),  # K-quant super-blocks of 256 values (kernels/quant_k.mojo)
    "q3_k": (256, 110),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
    "iq4_nl": (32, 18),   # f16 d, 16 bytes of nibbles indexing 16 non-linear levels (kernels/quant_iq.mojo)
    "iq4_xs": (256, 136),  # super-blocks: f16 d, 6-bit scales per 32 values, the same nibbles
    "f16": (1, 2),      # IEEE half per element
    "bf16": (1, 2),     # bfloat16 per element
}
# Formats with the int8-activation decode rows (act="q8"): every linear block format; F16 / BF16 (one
# value per "block") and the IQ4 levels keep float32 activations (kernels/quant.mojo has_q8_rows).
Q8_ACT_QTYPES = frozenset(QUANT_BLOCKS) - {"f16", "bf16", "iq4_nl", "iq4_xs"}
QType = Literal["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs",
                "f16", "bf16"]
ActQuant = Literal["f32", "q8"]
MatmulVariant = Literal["auto", "gemv", "gemm", "tiled", "tensor_core", "tensor_core_vec"]


def _device(*values: TensorValue) -> DeviceRef:
    return values[0].device


def matmul(x: TensorValue, w: TensorValue, variant: MatmulVariant = "auto") -> TensorValue:
    """y = x @ w^T.

    Args:
        x: [M, K] activations.
        w: [N, K] weights (nn.Linear layout).
        variant: CPU ``auto|gemv|gemm``; GPU ``auto|tiled|tensor_core|tensor_core_vec|gemv``.

    Returns:
        [M, N] in x's dtype.
    """
    out = TensorType(x.dtype, [x.shape[0], w.shape[0]], device=_device(x))
    return ops.custom("crucible.matmul", _device(x), [x, w], [out], parameters={"variant": variant})[0].tensor


def qmatmul(x: TensorValue, wq: TensorValue, n_out: int, k_in: int, qtype: QType,
            act: ActQuant = "f32", variant: str = "auto") -> TensorValue:
    """y = x @ dequant(wq)^T with wq holding GGUF blocks byte for byte.

    Args:
        x: [M, K] activations: float32, or bfloat16 on GPU (fp32 accumulation).
        wq: [N, K / block * block_bytes] uint8, one row of blocks per output feature.
        n_out: N.
        k_in: K (a multiple of the block size).
        qtype: Block format of wq.
        act: "f32" keeps x in float32; "q8" quantizes x to int8 per 32-value block on the CPU
            decode path (M <= 32) and uses integer dot products (kernels/qdot_int8.mojo), for the
            formats of Q8_ACT_QTYPES; the others always use "f32" (the model's load line and
            provenance name them: CrucibleModel.float_activation_types).
        variant: How a GPU warp reads its weight row: "auto", "lanes" or "staged"
            (kernels/qmatmul_gpu.mojo); "auto" only on CPU.

    Returns:
        [M, N] in x's dtype.
    """
    _check_qweight(wq, n_out, k_in, qtype)
    if variant not in ("auto", "lanes", "staged") or (variant != "auto" and not _device(x).is_gpu()):
        raise ValueError(f"qmatmul variant must be 'auto' (CPU) or auto/lanes/staged (GPU), got {variant!r}")
    out = TensorType(x.dtype, [x.shape[0], n_out], device=_device(x))
    return ops.custom("crucible.qmatmul", _device(x), [x, wq], [out],
                      parameters={"qtype": qtype, "act": effective_act(qtype, act, _device(x)),
                                  "variant": variant})[0].tensor


def _check_qweight(wq: TensorValue, n_out: int, k_in: int, qtype: QType) -> None:
    block, nbytes = QUANT_BLOCKS[qtype]
    if k_in % block:
        raise ValueError(f"{qtype}: K={k_in} is not a multiple of the block size {block}")
    if int(wq.shape[1]) != k_in // block * nbytes or int(wq.shape[0]) != n_out:
        raise ValueError(f"{qtype}: weight bytes {list(wq.shape)} do not hold [{n_out}, {k_in}]")


def effective_act(qtype: QType, act: ActQuant, device: DeviceRef) -> ActQuant:
    """The activation form a qmatmul over `qtype` runs with: "q8" exists for the formats of
    Q8_ACT_QTYPES on CPU (the op asserts the same); every other case runs "f32"."""
    if act not in ("f32", "q8"):
        raise ValueError(f"act must be 'f32' or 'q8', got {act!r}")
    return act if qtype in Q8_ACT_QTYPES and not device.is_gpu() else "f32"


Epilogue = Literal["cat", "silu", "gelu_tanh"]


def qmatmul2(x: TensorValue, wa: TensorValue, wb: TensorValue, n_a: int, n_b: int, k_in: int, qa: QType,
             qb: QType, act: ActQuant = "f32", epilogue: Epilogue = "cat") -> TensorValue:
    """Two projections of one x over GGUF block weights in one op (kernels/qmatmul2.mojo):
    [x @ A^T | x @ B^T] ("cat"), or act(x @ A^T) * (x @ B^T) ("silu", "gelu_tanh": a gated MLP).

    Computes exactly what qmatmul (and silu_mul) compute, with one dispatch and, in CPU decode, one
    hand-off to the cores instead of two or three ops.

    Args:
        x: [M, K] activations (float32, or bfloat16 on GPU).
        wa: [Na, K / block * block_bytes] uint8 blocks of format qa.
        wb: [Nb, ...] uint8 blocks of format qb.
        n_a: Na.
        n_b: Nb (== Na for the gated epilogues).
        k_in: K (a multiple of both block sizes).
        qa: Block format of wa.
        qb: Block format of wb.
        act: As qmatmul's; both formats must run the same effective form (effective_act).
        epilogue: "cat", "silu" or "gelu_tanh".

    Returns:
        [M, Na + Nb] for "cat", [M, Na] otherwise, in x's dtype.
    """
    _check_qweight(wa, n_a, k_in, qa)
    _check_qweight(wb, n_b, k_in, qb)
    if epilogue not in ("cat", "silu", "gelu_tanh"):
        raise ValueError(f"epilogue must be 'cat', 'silu' or 'gelu_tanh', got {epilogue!r}")
    if epilogue != "cat" and n_a != n_b:
        raise ValueError(f"a gated epilogue needs two projections of one width, got {n_a} and {n_b}")
    act_a, act_b = effective_act(qa, act, _device(x)), effective_act(qb, act, _device(x))
    if act_a != act_b:
        raise ValueError(f"{qa} runs act={act_a} and {qb} act={act_b}: one qmatmul2 runs one form")
    out = TensorType(x.dtype, [x.shape[0], n_a + n_b if epilogue == "cat" else n_a], device=_device(x))
    return ops.custom("crucible.qmatmul2", _device(x), [x, wa, wb], [out],
                      parameters={"qa": qa, "qb": qb, "act": act_a, "epilogue": epilogue})[0].tensor


def mlp(x: TensorValue, wg: TensorValue, wu: TensorValue, wd: TensorValue, n_inter: int, hidden: int,
        qg: QType, qu: QType, qd: QType, act: ActQuant = "f32", gate: Epilogue = "silu") -> TensorValue:
    """The gated MLP over GGUF block weights in one op (kernels/mlp.mojo):
    (gate(x @ Wg^T) * (x @ Wu^T)) @ Wd^T.

    Computes exactly what qmatmul2 (gated) then qmatmul compute, with one dispatch and, in CPU decode,
    one hand-off of two phases instead of two ops.

    Args:
        x: [M, H] activations (float32, or bfloat16 on GPU).
        wg: [I, H / block * block_bytes] uint8 blocks of format qg.
        wu: [I, ...] uint8 blocks of format qu.
        wd: [H, I / block * block_bytes] uint8 blocks of format qd.
        n_inter: I.
        hidden: H.
        qg: Block format of wg.
        qu: Block format of wu.
        qd: Block format of wd.
        act: As qmatmul's; the three formats must run the same effective form (effective_act).
        gate: "silu" or "gelu_tanh".

    Returns:
        [M, H] in x's dtype.
    """
    _check_qweight(wg, n_inter, hidden, qg)
    _check_qweight(wu, n_inter, hidden, qu)
    _check_qweight(wd, hidden, n_inter, qd)
    if gate not in ("silu", "gelu_tanh"):
        raise ValueError(f"gate must be 'silu' or 'gelu_tanh', got {gate!r}")
    acts = {effective_act(q, act, _device(x)) for q in (qg, qu, qd)}
    if len(acts) != 1:
        raise ValueError(f"{qg}, {qu} and {qd} run different activation forms for act={act}: one mlp runs one form")
    out = TensorType(x.dtype, [x.shape[0], hidden], device=_device(x))
    return ops.custom("crucible.mlp", _device(x), [x, wg, wu, wd], [out],
                      parameters={"qg": qg, "qu": qu, "qd": qd, "act": acts.pop(), "gate": gate})[0].tensor


def embedding(ids: TensorValue, table: TensorValue, hidden: int, qtype: str,
              dtype: DType = DType.float32) -> TensorValue:
    """Gathers rows of an embedding table, decoding GGUF blocks for the gathered rows only.

    Args:
        ids: [T] int64 token ids.
        table: [V, H] float32 (qtype "f32") or [V, H / block * block_bytes] uint8.
        hidden: H.
        qtype: "f32" or a key of QUANT_BLOCKS.
        dtype: The output's dtype: float32, or bfloat16 on GPU (the CPU branch computes in float32).

    Returns:
        [T, H] in dtype.
    """
    out = TensorType(dtype, [ids.shape[0], hidden], device=_device(ids))
    return ops.custom("crucible.embedding", _device(ids), [ids, table], [out],
                      parameters={"qtype": qtype})[0].tensor


def rmsnorm(x: TensorValue, weight: TensorValue, eps: float) -> TensorValue:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim.

    Args:
        x: [T, H].
        weight: [H].
        eps: Epsilon inside the square root.
    """
    out = TensorType(x.dtype, x.shape, device=_device(x))
    return ops.custom("crucible.rmsnorm", _device(x), [x, weight], [out],
                      parameters={"eps": float(eps)})[0].tensor


def add_rmsnorm(h: TensorValue, delta: TensorValue, weight: TensorValue, eps: float) -> tuple[TensorValue, TensorValue]:
    """The residual add and the norm after it, in one op.

    Args:
        h: [T, H] residual stream.
        delta: [T, H] branch output added to it.
        weight: [H].
        eps: Epsilon inside the square root.

    Returns:
        (h + delta, rmsnorm(h + delta) * weight), both [T, H].
    """
    t = TensorType(h.dtype, h.shape, device=_device(h))
    s, y = ops.custom("crucible.add_rmsnorm", _device(h), [h, delta, weight], [t, t],
                      parameters={"eps": float(eps)})
    return s.tensor, y.tensor


def qkv_rope_write(qkv: TensorValue, kv_blocks: BufferValue, inv_freq: TensorValue, row_offsets: TensorValue,
                   cache_lengths: TensorValue, lookup_table: TensorValue, layer: int, n_heads: int,
                   head_dim: int, interleaved: bool) -> TensorValue:
    """Rope on q and k of a fused qkv projection; k and v written into the paged cache (in place).

    One op for split + rope(q) + rope(k) + kv_cache_write. Positions and cache slots as in ``rope``
    and ``kv_cache_write``: token i of sequence b is at cache_lengths[b] + i.

    Args:
        qkv: [T, (Hq + 2 Hkv) D], per token the q heads, then the k heads, then the v heads.
        kv_blocks: [pages, 2, L, page_size, Hkv, D] MAX's paged cache buffer.
        inv_freq: [D / 2] float32.
        row_offsets: [B + 1] uint32.
        cache_lengths: [B] uint32 tokens already cached per sequence.
        lookup_table: [B, max_pages] uint32 page ids.
        layer: Layer index into the cache.
        n_heads: Hq.
        head_dim: D.
        interleaved: The rope layout (see ``rope``).

    Returns:
        q: [T, Hq, D] with rope applied.
    """
    layer_t = ops.constant(layer, DType.uint32, device=DeviceRef.CPU())
    out = TensorType(qkv.dtype, [qkv.shape[0], n_heads, head_dim], device=_device(qkv))
    return ops.inplace_custom("crucible.qkv_rope_write", _device(qkv),
                              [qkv, kv_blocks, inv_freq, row_offsets, cache_lengths, lookup_table, layer_t],
                              [out], parameters={"interleaved": interleaved})[0].tensor


def rope(x: TensorValue, inv_freq: TensorValue, row_offsets: TensorValue, start_pos: TensorValue,
         interleaved: bool) -> TensorValue:
    """Rotary position embedding of a ragged batch.

    Args:
        x: [T, heads, D].
        inv_freq: [D / 2] float32 inverse frequencies (rope_theta and any scaling folded in).
        row_offsets: [B + 1] uint32 token offsets of the sequences.
        start_pos: [B] uint32 position of each sequence's first token (its cached length).
        interleaved: Pairs (2i, 2i+1) (GGUF Llama) instead of (i, i + D/2) (HF Llama, Qwen2).

    Returns:
        [T, heads, D].
    """
    out = TensorType(x.dtype, x.shape, device=_device(x))
    return ops.custom("crucible.rope", _device(x), [x, inv_freq, row_offsets, start_pos], [out],
                      parameters={"interleaved": interleaved})[0].tensor


GatedAct = Literal["silu", "gelu_tanh"]


def silu_mul(gate_up: TensorValue, act: GatedAct = "silu") -> TensorValue:
    """act(gate) * up for a fused projection: SwiGLU (silu) or Gemma's GeGLU (gelu_tanh).

    Args:
        gate_up: [T, 2I], gate in the first half of each row, up in the second.
        act: "silu" (Llama, Qwen) or "gelu_tanh" (Gemma: transformers' gelu_pytorch_tanh).

    Returns:
        [T, I].
    """
    width = gate_up.shape[1] // 2
    out = TensorType(gate_up.dtype, [gate_up.shape[0], width], device=_device(gate_up))
    if act not in ("silu", "gelu_tanh"):
        raise ValueError(f"act must be 'silu' or 'gelu_tanh', got {act!r}")
    return ops.custom("crucible.silu_mul", _device(gate_up), [gate_up], [out],
                      parameters={"act": act})[0].tensor


def attention_ragged(q: TensorValue, k: TensorValue, v: TensorValue, row_offsets: TensorValue,
                     window: int = 0) -> TensorValue:
    """Causal GQA attention within each sequence of a ragged batch (K/V contiguous, no cache).

    Args:
        q: [T, Hq, D].
        k: [T, Hkv, D].
        v: [T, Hkv, D].
        row_offsets: [B + 1] uint32.

    Returns:
        [T, Hq, D].
    """
    out = TensorType(q.dtype, q.shape, device=_device(q))
    return ops.custom("crucible.attention_ragged", _device(q), [q, k, v, row_offsets], [out],
                      parameters={"window": int(window)})[0].tensor


def kv_cache_write(kv_blocks: BufferValue, k: TensorValue, v: TensorValue, row_offsets: TensorValue,
                   cache_lengths: TensorValue, lookup_table: TensorValue, layer: int) -> None:
    """Stores the new K/V rows of each sequence after its cached ones, into their pages (in place).

    Args:
        kv_blocks: [pages, 2, L, page_size, Hkv, D] MAX's paged cache buffer.
        k: [T, Hkv, D] new keys (rope applied).
        v: [T, Hkv, D] new values.
        row_offsets: [B + 1] uint32.
        cache_lengths: [B] uint32 tokens already cached per sequence.
        lookup_table: [B, max_pages] uint32 page ids.
        layer: Layer index into the cache.
    """
    layer_t = ops.constant(layer, DType.uint32, device=DeviceRef.CPU())
    ops.inplace_custom("crucible.kv_cache_write", _device(k),
                       [kv_blocks, k, v, row_offsets, cache_lengths, lookup_table, layer_t])


def attention_paged(q: TensorValue, kv_blocks: BufferValue, row_offsets: TensorValue,
                    cache_lengths: TensorValue, lookup_table: TensorValue, layer: int,
                    window: int = 0) -> TensorValue:
    """Causal GQA attention of new tokens over their sequence's cached and new K/V (paged).

    The new tokens' K/V must already be written (``kv_cache_write`` or ``qkv_rope_write``). Token i
    of sequence b sits at position cache_lengths[b] + i and attends to positions
    [0, cache_lengths[b] + i].

    Args:
        q: [T, Hq, D].
        kv_blocks: [pages, 2, L, page_size, Hkv, D].
        row_offsets: [B + 1] uint32.
        cache_lengths: [B] uint32.
        lookup_table: [B, max_pages] uint32.
        layer: Layer index into the cache.
        window: 0 for causal attention over the whole prefix; W > 0 for a sliding window (a query at
            position p sees positions p - W + 1 .. p).

    Returns:
        [T, Hq, D].
    """
    if window < 0:
        raise ValueError(f"window must be 0 (none) or positive, got {window}")
    layer_t = ops.constant(layer, DType.uint32, device=DeviceRef.CPU())
    out = TensorType(q.dtype, q.shape, device=_device(q))
    return ops.inplace_custom("crucible.attention_paged", _device(q),
                              [q, kv_blocks, row_offsets, cache_lengths, lookup_table, layer_t],
                              [out], parameters={"window": int(window)})[0].tensor


def read_bandwidth(x: TensorValue) -> TensorValue:
    """Sums x with plain vector loads on every core: the read-bandwidth ceiling probe.

    Args:
        x: [n] float32.

    Returns:
        [1] float32, the sum (so the loads cannot be optimized away).
    """
    out = TensorType(DType.float32, [1], device=_device(x))
    return ops.custom("crucible.read_bandwidth", _device(x), [x], [out])[0].tensor


def overhead_probe(x: TensorValue, parallel: bool, phases: int = 1) -> TensorValue:
    """x + 1 and no other work: chained, it times the fixed cost of one op (dispatch, and with
    `parallel` the hand-off of one empty item per core to the runtime's workers).

    Args:
        x: [1] float32.
        parallel: Whether the body goes through the parallel hand-off every parallel CPU kernel uses.
        phases: With parallel, that many phases of empty items in the one hand-off
            (common.parallel_phases): one phase boundary costs what an op with P phases costs over one
            with 1, divided by P - 1.

    Returns:
        [1] float32, x + 1.
    """
    if phases < 1:
        raise ValueError(f"phases must be >= 1, got {phases}")
    out = TensorType(DType.float32, [1], device=_device(x))
    return ops.custom("crucible.overhead_probe", _device(x), [x], [out],
                      parameters={"parallel": parallel, "phases": phases})[0].tensor
