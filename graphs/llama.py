"""The Llama-family decoder as one max.graph whose hot path is Crucible's custom ops.

Per layer: rmsnorm -> fused qkv projection (+ bias for Qwen2) -> rope on q and k, K/V written into
MAX's paged cache (one op) -> paged attention -> output projection -> residual add + rmsnorm (one op)
-> gate|up projection, silu_mul and the down projection (one crucible.mlp over GGUF blocks), whose
residual add is fused into the next norm (the next layer's, or the final norm). Then the lm_head, only for the rows whose logits are
wanted. Every matmul (float or GGUF blocks), attention, rmsnorm, rope and silu_mul is a crucible.* op;
MAX built-ins only reshape, slice, gather, add a Qwen2 bias and scale Gemma's embedding rows. Qwen3 and
Gemma 3 normalize each q and k head (crucible.rmsnorm over [T * heads, D] rows) between the projection and
the rope op. Gemma 3 also norms the attention and MLP outputs before their residual adds, gates its MLP
with gelu_tanh, and runs its sliding-window layers with the attention op's `window` and their own rope
frequencies (Mistral's, Phi-3's and Qwen's windows, when config.json sets them, take the same `window`); its query_pre_attn_scalar is folded into the q norm's weights (the attention op scales by
head_dim ** -0.5, and the norm's output feeds only the linear rope). Fusing the residual adds and the
split/rope/cache-write step takes 5 kernel launches out of each layer (~2 us each on the CPU, where a
batch-1 decode step launches ~14 per layer), the gated MLP epilogue one more, and the MLP as one op one more. A qkv whose
parts have two GGUF types (llama.cpp's K-quant presets) runs as one crucible.qmatmul2, not as two
matmuls and a concat; a gate|up of two types runs inside crucible.mlp the same way.

Graph inputs (symbolic dims in quotes):
  tokens             ["total_seq_len"] int64      ragged batch of new tokens
  input_row_offsets  ["row_offsets_len"] uint32   [B + 1] token offsets of the sequences
  logit_rows         ["num_logits"] int64         rows of the batch to compute logits for
    (or, with logits="last_token", MAX's return_n_logits [1] int64: its pipeline's input order; the
     rows are then each sequence's last token, computed in the graph, and num_logits = B)
  *kv inputs         MAX's paged KV cache inputs (kv_params.get_symbolic_inputs())
Outputs: logits ["num_logits", vocab] float32, and (logits="rows") their argmax ["num_logits"] int64, so
a step whose sequences all decode greedily copies token ids instead of logits off the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from max import tree
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, TensorValue, Weight, ops

from crucible.core.bf16 import bf16_bits
from graphs import kernel_ops as K
from graphs.config import ModelConfig
from graphs.weights import Linear, ModelWeights


@dataclass
class _WeightBinder:
    """Creates graph Weights and collects the name -> array registry MAX loads them from.

    Float arrays become Weights of the graph's dtype (in a bf16 graph: bf16 bits, viewed by MAX as
    bfloat16); byte arrays stay uint8.
    """

    device: DeviceRef
    dtype: DType
    registry: dict[str, object]

    def add(self, name: str, array: np.ndarray) -> TensorValue:
        if array.dtype == np.uint8:
            self.registry[name] = array
            return Weight(name, DType.uint8, list(array.shape), device=self.device)
        if self.dtype == DType.bfloat16:
            return self._bf16(name, bf16_bits(array))
        self.registry[name] = array
        return Weight(name, DType.float32, list(array.shape), device=self.device)

    def _bf16(self, name: str, bits: np.ndarray) -> TensorValue:
        from max.driver import Buffer

        self.registry[name] = Buffer.from_numpy(np.ascontiguousarray(bits)).view(DType.bfloat16)
        return Weight(name, DType.bfloat16, list(bits.shape), device=self.device)

    def binds_as_bytes(self, lin: Linear) -> bool:
        """Whether linear() binds lin as uint8 bytes (crucible.qmatmul's input), not as a float matrix."""
        return lin.data.dtype == np.uint8 and not (lin.qtype == "bf16" and self.dtype == DType.bfloat16)

    def linear(self, name: str, lin: Linear, as_bytes: bool = False) -> tuple[Linear, TensorValue, TensorValue | None]:
        """Binds a linear layer. A "bf16" weight in a bf16 graph binds as a bf16 [N, K] tensor for
        crucible.matmul, unless `as_bytes` (crucible.qmatmul's input, e.g. for float32 logits)."""
        if lin.qtype == "bf16" and self.dtype == DType.bfloat16 and not as_bytes:
            w = self._bf16(name + ".weight", lin.data.view(np.uint16).reshape(lin.n_out, lin.k_in))
        else:
            w = self.add(name + ".weight", lin.data)
        b = self.add(name + ".bias", lin.bias) if lin.bias is not None else None
        return lin, w, b


def _project(x: TensorValue, bound: tuple[Linear, TensorValue, TensorValue | None],
             act: K.ActQuant = "f32") -> TensorValue:
    # x: [T, K] -> [T, N] in x's dtype
    lin, w, b = bound
    if w.dtype != DType.uint8:  # float32, or bf16 in a bf16 graph
        y = K.matmul(x, w)
    else:
        y = K.qmatmul(x, w, lin.n_out, lin.k_in, lin.qtype, act)
    return y + b if b is not None else y


def _pair_bound(x: TensorValue, name: str, parts: tuple[Linear, ...], binder: _WeightBinder,
                act: K.ActQuant) -> tuple[TensorValue, TensorValue] | None:
    # Two bias-free parts over GGUF bytes that run one activation form: crucible.qmatmul2's weights,
    # bound only then (the other paths bind the same parts themselves).
    if len(parts) != 2 or any(lin.bias is not None or not binder.binds_as_bytes(lin) for lin in parts):
        return None
    if len({K.effective_act(lin.qtype, act, x.device) for lin in parts}) != 1:
        return None
    return tuple(binder.linear(f"{name}.{j}", lin)[1] for j, lin in enumerate(parts))


def _project_parts(x: TensorValue, name: str, parts: tuple[Linear, ...], binder: _WeightBinder,
                   act: K.ActQuant, fuse: bool = True) -> TensorValue:
    # x: [T, K] -> [T, sum of N]: one matmul for a fused projection; two parts of different types in
    # one crucible.qmatmul2 (unless not fuse); else one op per part, concatenated.
    if len(parts) == 1:
        return _project(x, binder.linear(name, parts[0]), act)
    pair = _pair_bound(x, name, parts, binder, act) if fuse else None
    if pair is not None:
        a, b = parts
        return K.qmatmul2(x, *pair, a.n_out, b.n_out, a.k_in, a.qtype, b.qtype, act, "cat")
    return ops.concat([_project(x, binder.linear(f"{name}.{j}", lin), act) for j, lin in enumerate(parts)], axis=1)


def _gate_up_halves(parts: tuple[Linear, ...]) -> tuple[Linear, Linear] | None:
    # gate and up as two parts of one width: a fused gate|up split into its two halves (row views of
    # the same bytes), or the two parts as they are; None when they are not two such parts.
    halves = parts
    if len(parts) == 1 and parts[0].bias is None and parts[0].n_out % 2 == 0:
        lin, width = parts[0], parts[0].n_out // 2
        halves = tuple(Linear(lin.qtype, lin.data[j * width:(j + 1) * width], width, lin.k_in) for j in (0, 1))
    return halves if len(halves) == 2 and halves[0].n_out == halves[1].n_out else None


def _gated_mlp(x: TensorValue, name: str, parts: tuple[Linear, ...], binder: _WeightBinder, act: K.ActQuant,
               mlp_act: K.GatedAct, fuse: bool = True) -> TensorValue:
    # x: [T, H] -> act(x @ gate^T) * (x @ up^T): [T, I]. Over GGUF bytes (and if fuse), one
    # crucible.qmatmul2 with the gated epilogue; else the projection, then crucible.silu_mul.
    if not fuse:
        return K.silu_mul(_project_parts(x, name, parts, binder, act, fuse), mlp_act)
    halves = _gate_up_halves(parts)
    pair = _pair_bound(x, name, halves, binder, act) if halves is not None else None
    if pair is not None:
        g, u = halves
        return K.qmatmul2(x, *pair, g.n_out, u.n_out, g.k_in, g.qtype, u.qtype, act, mlp_act)
    return K.silu_mul(_project_parts(x, name, parts, binder, act), mlp_act)


def _mlp(x: TensorValue, prefix: str, gate_up: tuple[Linear, ...], down: Linear, binder: _WeightBinder,
         act: K.ActQuant, mlp_act: K.GatedAct, fuse: bool = True) -> TensorValue:
    # x: [T, H] -> down(act(x @ gate^T) * (x @ up^T)): [T, H]. Over GGUF bytes (and if fuse), one
    # crucible.mlp when gate, up and down run one activation form; else _gated_mlp, then down.
    halves = _gate_up_halves(gate_up) if fuse else None
    if (halves is not None and down.bias is None and binder.binds_as_bytes(down)
            and K.effective_act(down.qtype, act, x.device) == K.effective_act(halves[0].qtype, act, x.device)):
        pair = _pair_bound(x, prefix + "gate_up", halves, binder, act)
        if pair is not None:
            g, u = halves
            wd = binder.linear(prefix + "down", down)[1]
            return K.mlp(x, *pair, wd, g.n_out, g.k_in, g.qtype, u.qtype, down.qtype, act, mlp_act)
    h = _gated_mlp(x, prefix + "gate_up", gate_up, binder, act, mlp_act, fuse)  # [T, I]
    return _project(h, binder.linear(prefix + "down", down), act)


def _residual_norm(h: TensorValue, pending: TensorValue | None, weight: TensorValue,
                   eps: float) -> tuple[TensorValue, TensorValue]:
    # h: [T, H] residual stream; pending: [T, H] branch output not yet added to it (None: nothing).
    # Returns (h + pending, its rmsnorm), the add fused into the norm's op.
    if pending is None:
        return h, K.rmsnorm(h, weight, eps)
    return K.add_rmsnorm(h, pending, weight, eps)


def _qk_norm(qkv: TensorValue, q_w: TensorValue, k_w: TensorValue, hq: int, hkv: int, d: int,
             eps: float) -> TensorValue:
    # qkv: [T, (Hq + 2 Hkv) D] -> the same with every q and k head RMS-normalized over D (Qwen3), before
    # the rope/cache-write op; v passes through.
    n_tokens = qkv.shape[0]
    q = K.rmsnorm(ops.reshape(qkv[:, : hq * d], [-1, d]), q_w, eps)  # [T Hq, D]
    k = K.rmsnorm(ops.reshape(qkv[:, hq * d: (hq + hkv) * d], [-1, d]), k_w, eps)  # [T Hkv, D]
    return ops.concat([ops.reshape(q, [n_tokens, hq * d]), ops.reshape(k, [n_tokens, hkv * d]),
                       qkv[:, (hq + hkv) * d:]], axis=1)


def _single_device_kv(unflattened):
    """The one device's PagedCacheValues, whether the params hand back a list or a tree of them."""
    from max.nn.kv_cache import KVCacheInputsPerDevice

    leaves = tree.leaves(unflattened, leaf=KVCacheInputsPerDevice)
    if len(leaves) != 1:
        raise ValueError(f"Crucible's graph runs on one device and one KV cache; got {len(leaves)}")
    return leaves[0]


def build_graph(cfg: ModelConfig, weights: ModelWeights, kv_params, device: DeviceRef,
                kernels_path, logits: Literal["rows", "last_token"] = "rows",
                activations: K.ActQuant = "f32", fuse_pairs: bool = True) -> tuple[Graph, dict[str, object]]:
    """Builds the decoder graph.

    Args:
        cfg: Model configuration.
        weights: Weights in kernel form.
        kv_params: MAX MHAKVCacheParams for the paged cache (cfg's heads and layers). Its dtype is the
            graph's compute dtype: float32, or bfloat16 (GPU only; fp32 accumulation in every kernel,
            float32 logits).
        device: Where the graph runs.
        kernels_path: The prebuilt kernel package.
        logits: "rows" takes the rows to compute logits for as the third input (our engine);
            "last_token" takes MAX's return_n_logits there and returns each sequence's last row
            (MAX's pipeline with ReturnLogits.LAST_TOKEN).
        activations: Activation format of the quantized projections' decode path (kernel_ops.qmatmul).
        fuse_pairs: Two-part projections over GGUF blocks as crucible.qmatmul2 and the gated MLP as
            crucible.mlp (False: separate matmuls, concat and silu_mul, the same values; the A/B
            baseline).

    Returns:
        The graph and the weights registry to load it with (numpy arrays, and MAX Buffers for bf16).
    """
    dtype = kv_params.dtype
    if dtype not in (DType.float32, DType.bfloat16):
        raise ValueError(f"the graph computes in float32 or bfloat16, not {dtype}")
    if logits not in ("rows", "last_token"):
        raise ValueError(f"logits must be 'rows' or 'last_token', got {logits!r}")
    kv_flat, _ = tree.flatten(kv_params.get_symbolic_inputs())
    input_types = [
        TensorType(DType.int64, ["total_seq_len"], device=device),
        TensorType(DType.uint32, ["row_offsets_len"], device=device),
        TensorType(DType.int64, ["num_logits"] if logits == "rows" else [1], device=device),
        *kv_flat,
    ]
    binder = _WeightBinder(device, dtype, {})
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    with Graph("crucible_llama", input_types=input_types, custom_extensions=[kernels_path]) as graph:
        tokens, offsets, logit_rows = (v.tensor for v in graph.inputs[:3])
        if logits == "last_token":
            # row_offsets: [B + 1]; the last token of sequence b is row offsets[b + 1] - 1.
            ends = ops.cast(offsets[1:], DType.int64)
            logit_rows = ends - ops.constant(1, DType.int64, device=device)
        kv = _single_device_kv(kv_params.unflatten_kv_inputs(iter(graph.inputs[3:])))
        inv_freq = ops.constant(cfg.inv_freq(), DType.float32, device=device)
        inv_freq_local = ops.constant(cfg.inv_freq(local=True), DType.float32, device=device)
        emb = weights.embedding
        emb_w = binder.add("embed.weight", emb.data)  # the table's own form: f32 or bytes
        h = K.embedding(tokens, emb_w, cfg.hidden_size, emb.qtype, dtype)  # [T, H]
        if cfg.embed_scale is not None:
            h = h * ops.constant(np.float32(cfg.embed_scale), dtype, device=device)
        # Gemma 3's query scale, folded into q's norm: q_norm(x) * c scales the scores by c.
        q_fold = np.float32(cfg.query_scale * np.sqrt(d)) if cfg.query_scale is not None else np.float32(1.0)
        n_tokens = h.shape[0]
        eps = cfg.rms_norm_eps
        mlp_out = None  # the previous layer's MLP output, added to h by the next norm: [T, H]
        for i, layer in enumerate(weights.layers):
            p = f"layers.{i}."
            h, x = _residual_norm(h, mlp_out, binder.add(p + "attn_norm", layer.attn_norm), eps)
            qkv = _project_parts(x, p + "qkv", layer.qkv, binder, activations, fuse_pairs)  # [T, (Hq + 2 Hkv) D]
            if layer.q_norm is not None:
                q_w = layer.q_norm if q_fold == 1 else (layer.q_norm * q_fold).astype(np.float32)
                qkv = _qk_norm(qkv, binder.add(p + "q_norm", q_w), binder.add(p + "k_norm", layer.k_norm),
                               hq, hkv, d, eps)
            window = cfg.layer_window(i)
            q = K.qkv_rope_write(qkv, kv.kv_blocks, inv_freq_local if window else inv_freq, offsets,
                                 kv.cache_lengths, kv.lookup_table, i, hq, d, cfg.rope_interleaved)  # [T, Hq, D]
            attn = K.attention_paged(q, kv.kv_blocks, offsets, kv.cache_lengths, kv.lookup_table, i, window=window)
            o = _project(ops.reshape(attn, [n_tokens, hq * d]), binder.linear(p + "o_proj", layer.o_proj), activations)
            if layer.post_attn_norm is not None:
                o = K.rmsnorm(o, binder.add(p + "post_attn_norm", layer.post_attn_norm), eps)
            h, x = _residual_norm(h, o, binder.add(p + "ffn_norm", layer.ffn_norm), eps)
            mlp_out = _mlp(x, p, layer.gate_up, layer.down, binder, activations, cfg.mlp_act, fuse_pairs)  # [T, H]
            if layer.post_ffn_norm is not None:
                mlp_out = K.rmsnorm(mlp_out, binder.add(p + "post_ffn_norm", layer.post_ffn_norm), eps)
        _, h = _residual_norm(h, mlp_out, binder.add("final_norm", weights.final_norm), eps)
        h_sel = ops.gather(h, logit_rows, axis=0)  # [num_logits, H]
        if dtype != DType.float32:
            # float32 logits: the head reads its weight's bytes (crucible.qmatmul) with fp32 x and output
            h_sel = ops.cast(h_sel, DType.float32)
        if weights.lm_head is weights.embedding:
            head = (emb, emb_w, None)
        else:
            head = binder.linear("lm_head", weights.lm_head, as_bytes=True)
        logits_out = _project(h_sel, head, activations)  # [num_logits, vocab] float32
        if logits == "rows":
            # Greedy steps read only this: [num_logits] ids instead of [num_logits, vocab] logits.
            graph.output(logits_out, ops.squeeze(ops.argmax(logits_out, axis=-1), -1))
        else:
            graph.output(logits_out)
    return graph, binder.registry
