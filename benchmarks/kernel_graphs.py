"""The compiled graphs the kernel benchmark times: one per op and system, symbolic in every size.

Each graph holds exactly one op of interest, so a timed ``execute`` is that op plus MAX's fixed
per-execute cost (measured separately with an empty graph and reported as ``exec_overhead_us``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops

from graphs import kernel_ops as K


class NotRun:
    """Stands in for a graph while the benchmark only compiles (bench_precompile.py): runs nothing."""

    def execute(self, *args: object) -> list[object]:
        return []


@dataclass
class GraphSet:
    """Lazily compiled graphs keyed by name, on one session and device.

    prebuild: None to load and run graphs. Otherwise the set only fills MAX's graph cache: it
    compiles the graphs whose name `prebuild` accepts, and hands out a NotRun for every graph.
    """

    session: object
    ref: DeviceRef
    kernels: object
    compiled: dict[str, object]
    prebuild: Callable[[str], bool] | None = None

    def get(self, name: str, input_types: list[object], build: Callable[..., list[object]]) -> object:
        if name not in self.compiled:
            if self.prebuild is not None and not self.prebuild(name):
                self.compiled[name] = NotRun()  # another prebuild worker's graph
                return self.compiled[name]
            with Graph(name, input_types=input_types, custom_extensions=[self.kernels]) as g:
                g.output(*build(*g.inputs))
            if self.prebuild is not None:
                self.session.compile(g)
                self.compiled[name] = NotRun()
            else:
                self.compiled[name] = self.session.load(g)
        return self.compiled[name]

    def empty(self):
        # One trivial op: the fixed cost of executing a graph that launches a kernel.
        f32 = DType.float32
        return self.get("empty", [TensorType(f32, [1], device=self.ref)], lambda x: [ops.negate(x.tensor)])

    def matmul(self, system: str, dtype: DType):
        """crucible.matmul with the "auto" variant (the one models run), or MAX's ops.matmul."""
        types = [TensorType(dtype, ["m", "k"], device=self.ref), TensorType(dtype, ["n", "k"], device=self.ref)]
        if system == "crucible":
            return self.get(f"mm_ours_{dtype}", types, lambda x, w: [K.matmul(x.tensor, w.tensor, "auto")])
        # MAX's best CPU layout: weights stored [N, K] and transposed in the graph (a view).
        return self.get(f"mm_max_{dtype}", types,
                        lambda x, w: [ops.matmul(x.tensor, ops.transpose(w.tensor, 0, 1))])

    def qmatmul(self, qtype: str, act: str = "f32"):
        """One crucible.qmatmul; act "q8" is the int8-activation variant (decode path, M <= 32)."""
        f32 = DType.float32
        types = [TensorType(f32, ["m", "k"], device=self.ref), TensorType(DType.uint8, ["n", "kb"], device=self.ref)]

        def build(x, w):
            out = TensorType(f32, [x.tensor.shape[0], w.tensor.shape[0]], device=self.ref)
            return [ops.custom("crucible.qmatmul", self.ref, [x.tensor, w.tensor], [out],
                               parameters={"qtype": qtype, "act": act})[0].tensor]

        return self.get(f"qmm_{qtype}_{act}", types, build)

    def max_qmatmul_q4_0(self):
        """MAX's own ops.qmatmul on the same Q4_0 bytes (it quantizes x to int8 inside, as our act="q8")."""
        from max.graph.quantization import QuantizationEncoding

        f32 = DType.float32
        types = [TensorType(f32, ["m", "k"], device=self.ref), TensorType(DType.uint8, ["n", "kb"], device=self.ref)]
        return self.get("qmm_max_q4_0", types,
                        lambda x, w: [ops.qmatmul(QuantizationEncoding.Q4_0, None, x.tensor, w.tensor)])

    def chain(self, system: str, qtype: str, copies: int, k: int, w_shape: tuple[int, int], act: str = "f32",
              dtype: DType = DType.float32, variant: str = "auto"):
        """`copies` matmuls in sequence, as a model's layers run them: x_0 [m, k] is the input (m
        symbolic), y_i = x_i @ W_i^T [m, n] with W_i a distinct buffer (one input each), and x_{i+1} is
        y_i cut or repeated to k columns (a MAX slice, plus a concat when n < k; the same glue for every
        system). One output, so a timed execute is `copies` ops reading their weights from memory, with
        one execute overhead. (Independent ops with one output each measured ~6 us more per op: MAX
        hands every output back to Python.)

        system: "crucible" (crucible.qmatmul for a block qtype, crucible.matmul for "f32") or "max"
        (ops.matmul, qtype "f32" only). qtype "f32" means float weights of `dtype`. w_shape: each W_i's
        array shape ([n, k] floats or [n, row bytes]). act: crucible.qmatmul's activation variant ("f32"
        or "q8"). dtype: x's (and float weights') dtype: float32, or bfloat16 on GPU. variant:
        crucible.matmul's or crucible.qmatmul's variant parameter.
        """
        n = w_shape[0]
        wdt = dtype if qtype == "f32" else DType.uint8
        types = [TensorType(dtype, ["m", k], device=self.ref)] + [
            TensorType(wdt, list(w_shape), device=self.ref) for _ in range(copies)]

        def one(x, w):
            if system == "max":
                return ops.matmul(x, ops.transpose(w, 0, 1))
            if qtype == "f32":
                return K.matmul(x, w, variant)
            return K.qmatmul(x, w, n, k, qtype, act, variant)

        def to_k(y):
            if n < k:
                y = ops.concat([y] * -(-k // n), axis=1)
            return ops.slice_tensor(y, [slice(None), slice(0, k)])

        def build(x, *ws):
            x = x.tensor
            for w in ws:
                x = to_k(one(x, w.tensor))
            return [x]

        return self.get(f"chain_{system}_{qtype}_{act}_{variant}_{dtype}_{copies}_{k}_{n}", types, build)

    def rmsnorm(self, system: str, dtype: DType):
        types = [TensorType(dtype, ["t", "h"], device=self.ref), TensorType(dtype, ["h"], device=self.ref)]
        if system == "crucible":
            return self.get(f"rms_ours_{dtype}", types, lambda x, w: [K.rmsnorm(x.tensor, w.tensor, 1e-5)])
        return self.get(f"rms_max_{dtype}", types, lambda x, w: [ops.rms_norm(x.tensor, w.tensor, 1e-5)])

    def add_rmsnorm(self, system: str, dtype: DType):
        """Residual add + norm, both results: our fused op, or MAX's add then ops.rms_norm."""
        types = [TensorType(dtype, ["t", "h"], device=self.ref), TensorType(dtype, ["t", "h"], device=self.ref),
                 TensorType(dtype, ["h"], device=self.ref)]
        if system == "crucible":
            return self.get(f"addrms_ours_{dtype}", types,
                            lambda x, d, w: list(K.add_rmsnorm(x.tensor, d.tensor, w.tensor, 1e-5)))

        def build(x, d, w):
            s = x.tensor + d.tensor
            return [s, ops.rms_norm(s, w.tensor, 1e-5)]

        return self.get(f"addrms_max_{dtype}", types, build)

    def qkv_rope_write(self, system: str, dtype: DType, n_heads: int, n_kv: int, head_dim: int):
        """From a fused qkv projection to roped q with k, v in a paged cache [pages, 2, 1, 128, Hkv, D].

        system "crucible": crucible.qkv_rope_write; "unfused": what the decoder graph ran
        before that op existed, split + crucible.rope on q and on k + crucible.kv_cache_write.
        """
        from max.graph import BufferType

        u32, f32, d = DType.uint32, DType.float32, head_dim
        types = [BufferType(dtype, ["pages", 2, 1, 128, n_kv, d], device=self.ref),
                 TensorType(dtype, ["t", (n_heads + 2 * n_kv) * d], device=self.ref),
                 TensorType(f32, [d // 2], device=self.ref), TensorType(u32, ["b1"], device=self.ref),
                 TensorType(u32, ["b"], device=self.ref), TensorType(u32, ["b", "mp"], device=self.ref)]

        def fused(blocks, qkv, invf, offs, lens, lut):
            return [K.qkv_rope_write(qkv.tensor, blocks.buffer, invf.tensor, offs.tensor, lens.tensor, lut.tensor,
                                     0, n_heads, d, False)]

        def unfused(blocks, qkv, invf, offs, lens, lut):
            t = qkv.tensor.shape[0]
            q, k, v = ops.split(qkv.tensor, [n_heads * d, n_kv * d, n_kv * d], axis=1)
            q = K.rope(ops.reshape(q, [t, n_heads, d]), invf.tensor, offs.tensor, lens.tensor, False)
            k = K.rope(ops.reshape(k, [t, n_kv, d]), invf.tensor, offs.tensor, lens.tensor, False)
            K.kv_cache_write(blocks.buffer, k, ops.reshape(v, [t, n_kv, d]), offs.tensor, lens.tensor,
                             lut.tensor, 0)
            return [q]

        build = fused if system == "crucible" else unfused
        return self.get(f"qkvrw_{system}_{dtype}_{n_heads}_{n_kv}_{d}", types, build)

    def silu_mul(self, system: str, dtype: DType):
        if system == "crucible":
            types = [TensorType(dtype, ["t", "i2"], device=self.ref)]
            return self.get(f"silu_ours_{dtype}", types, lambda gu: [K.silu_mul(gu.tensor)])
        # MAX's composition gets gate and up as two tensors (as from two projections).
        types = [TensorType(dtype, ["t", "i"], device=self.ref), TensorType(dtype, ["t", "i"], device=self.ref)]
        return self.get(f"silu_max_{dtype}", types, lambda g, u: [ops.silu(g.tensor) * u.tensor])

    def rope(self, system: str, dtype: DType, head_dim: int):
        u32, f32 = DType.uint32, DType.float32
        types = [TensorType(dtype, ["t", "nh", head_dim], device=self.ref), TensorType(u32, ["b1"], device=self.ref),
                 TensorType(u32, ["b"], device=self.ref)]
        if system == "crucible":
            types.append(TensorType(f32, [head_dim // 2], device=self.ref))
            return self.get(f"rope_ours_{dtype}_{head_dim}", types, lambda x, o, s, f: [
                K.rope(x.tensor, f.tensor, o.tensor, s.tensor, False)])
        types.append(TensorType(f32, ["maxpos", head_dim], device=self.ref))
        from max.nn.kernels import rope_ragged

        return self.get(f"rope_max_{dtype}_{head_dim}", types, lambda x, o, s, f: [
            rope_ragged(x.tensor, o.tensor, s.tensor, ops.cast(f.tensor, dtype), interleaved=False)])

    def attention(self, system: str, kv_params, n_heads: int):
        """Paged attention over MAX's KV cache inputs: one op per layer of the cache, in sequence (the
        output of layer i is the query of layer i + 1, as a model's layers run them), so a decode row
        can read a cache larger than the GPU's L2 within one execute."""
        from max import tree
        from max.nn.attention import MHAMaskVariant
        from max.nn.kernels import flash_attention_ragged

        dtype, d, layers = kv_params.dtype, kv_params.head_dim, kv_params.num_layers
        flat, _ = tree.flatten(kv_params.get_symbolic_inputs())
        types = [TensorType(dtype, ["t", n_heads, d], device=self.ref),
                 TensorType(DType.uint32, ["b1"], device=self.ref), *flat]

        def build(q, offs, *kv):
            kvc = kv_params.unflatten_kv_inputs(iter(kv))[0]
            x = q.tensor
            for i in range(layers):
                if system == "crucible":
                    x = K.attention_paged(x, kvc.kv_blocks, offs.tensor, kvc.cache_lengths, kvc.lookup_table, i)
                else:
                    layer = ops.constant(i, DType.uint32, device=DeviceRef.CPU())
                    x = flash_attention_ragged(kv_params, x, offs.tensor, kvc, layer,
                                               MHAMaskVariant.CAUSAL_MASK, d ** -0.5)
            return [x]

        return self.get(f"attn_{system}_{dtype}_{kv_params.n_kv_heads}_{d}_{n_heads}_{layers}", types, build)

    def overhead_chain(self, copies: int, parallel: bool, phases: int = 1):
        """`copies` crucible.overhead_probe ops in sequence (each adds 1 to the previous output), each
        with `phases` phases when parallel."""
        f32 = DType.float32

        def build(x):
            y = x.tensor
            for _ in range(copies):
                y = K.overhead_probe(y, parallel, phases)
            return [y]

        name = f"overhead_{copies}_{parallel}" + (f"_p{phases}" if phases != 1 else "")
        return self.get(name, [TensorType(f32, [1], device=self.ref)], build)

    def bandwidth(self):
        types = [TensorType(DType.float32, ["n"], device=self.ref)]
        return self.get("read_bandwidth", types, lambda x: [K.read_bandwidth(x.tensor)])
