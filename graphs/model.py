"""A compiled Crucible model: config, weights, graph and its provenance, ready to execute steps.

One `execute` runs one ragged batch of new tokens through the decoder, reading and writing MAX's
paged KV cache, and returns logits for the requested rows. Scheduling (which sequences, which tokens,
cache pages) belongs to the caller: the pipeline (pipelines/) or the greedy helper (graphs/generate.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from crucible.core.devices import DTYPES, max_device
from crucible.core.kernel_build import KernelBuild, kernel_package
from crucible.core.registry import ModelSource, resolve_model
from graphs.config import ModelConfig, load_config
from graphs.cpu_threads import CpuThreadTuner
from graphs.inventory import inventory, load_line
from graphs.llama import build_graph
from graphs.provenance import OpRecord, graph_ops, summary
from graphs.weights import ModelWeights, load_weights

PAGE_SIZE = 128  # MAX's paged cache requires a multiple of 128


@dataclass(frozen=True)
class ModelOptions:
    """How to build and place a model.

    Attributes:
        device: "cpu" or "gpu".
        page_size: KV cache page size in tokens (multiple of 128).
        activations: "q8" quantizes activations to int8 per 32-value block in the CPU decode path (up
            to 32 rows) of the matmuls over GGUF block weights (kernel_ops.Q8_ACT_QTYPES), as llama.cpp does:
            faster, with a small extra error; "f32" keeps them float. Float weights always use float.
        tune_threads: On CPU, lower the priority of MAX's runtime threads once they are seen (see
            graphs/cpu_threads.py: busy-waiting workers otherwise delay the thread that drives each step).
            Process-wide, and not undone for later models.
        dtype: The graph's compute dtype: "float32", "bfloat16" (GPU only: bf16 weights, activations and
            KV cache, fp32 accumulation and logits; GGUF blocks stay blocks), or "auto" (float32 on CPU,
            bfloat16 on GPU). `compute_dtype` is the resolved one.
        fuse_pairs: Run two-part projections over GGUF blocks (q|k + v of two types) as one
            crucible.qmatmul2 and the gated MLP (gate, up, activation, down) as one crucible.mlp; False
            builds them as separate matmuls, concat and silu_mul (the same values:
            benchmarks/kernel_ab.py's --unfused-a baseline).
    """

    device: str = "cpu"
    page_size: int = PAGE_SIZE
    activations: str = "f32"
    tune_threads: bool = True
    dtype: str = "auto"
    fuse_pairs: bool = True

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "gpu"):
            raise ValueError(f"device must be cpu or gpu, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.compute_dtype == "bfloat16" and self.device != "gpu":
            raise ValueError("dtype='bfloat16' runs on GPU only; the CPU kernels compute in float32")
        if self.page_size % 128 or self.page_size <= 0:
            raise ValueError("page_size must be a positive multiple of 128")
        if self.activations not in ("f32", "q8"):
            raise ValueError(f"activations must be f32 or q8, got {self.activations!r}")
        if self.activations == "q8" and self.device != "cpu":
            raise ValueError("activations='q8' is a CPU kernel variant; the GPU kernels use float activations")

    @property
    def compute_dtype(self) -> str:
        """"float32" or "bfloat16": dtype with "auto" resolved for the device."""
        if self.dtype != "auto":
            return self.dtype
        return "float32" if self.device == "cpu" else "bfloat16"

    @property
    def max_dtype(self):
        """compute_dtype as MAX's DType."""
        from max.dtype import DType

        return DType.bfloat16 if self.compute_dtype == "bfloat16" else DType.float32


@dataclass(frozen=True)
class CompiledDecoder:
    """The decoder graph compiled into a session, with what it was built from.

    Attributes:
        model: MAX's loaded model (execute runs one step).
        config: The model's configuration.
        weights: The weights the graph reads (on CPU the session maps their arrays: keep them alive).
        registry: The weights registry handed to the session.
        ops: Every op of the graph, for provenance.
        kernels: The kernel build the graph runs.
        compile_seconds: Time to compile and load.
    """

    model: object
    config: ModelConfig
    weights: ModelWeights
    registry: dict
    ops: list[OpRecord]
    kernels: KernelBuild
    compile_seconds: float

    @property
    def provenance(self) -> dict[str, object]:
        """Which kernels the graph runs (ours or MAX's) and from which kernel build."""
        return {**summary(self.ops), "kernel_build": self.kernels.content_hash}


def compile_decoder(source: ModelSource, kv_params, device_ref, session, activations: str = "f32",
                    logits: str = "rows", kernels: KernelBuild | None = None,
                    config: ModelConfig | None = None, fuse_pairs: bool = True) -> CompiledDecoder:
    """Loads a model's weights and compiles its decoder graph (graphs/llama.py) into `session`.

    The one build path: CrucibleModel and MAX's pipeline architecture (pipelines/max_arch) both use it.

    Args:
        source: The resolved model.
        kv_params: The paged KV cache's parameters.
        device_ref: Where the graph runs.
        session: MAX's InferenceSession to compile into. The graph computes in kv_params.dtype (float32,
            or bfloat16 with float linears loaded as bf16).
        activations: "f32" or "q8" (ModelOptions.activations).
        logits: "rows" (logits of the rows asked for) or "last_token" (MAX's pipeline input order).
        kernels: The kernel package (default: this checkout's).
        config: The model's config if already read.
        fuse_pairs: ModelOptions.fuse_pairs.
    """
    config = config or load_config(source)
    from max.dtype import DType

    weights = load_weights(source, config, "bf16" if kv_params.dtype == DType.bfloat16 else "f32")
    kernels = kernels or kernel_package()
    graph, registry = build_graph(config, weights, kv_params, device_ref, kernels.path, logits=logits,
                                  activations=activations, fuse_pairs=fuse_pairs)
    ops = graph_ops(graph)
    start = time.perf_counter()
    model = session.load(graph, weights_registry=registry)
    return CompiledDecoder(model, config, weights, registry, ops, kernels, time.perf_counter() - start)


class CrucibleModel:
    """Loads a model (registry name, GGUF file or HF folder) and compiles its graph.

    Args:
        model: What to load.
        options: Device and cache layout.
        session: An InferenceSession to compile into (one is created if omitted).
        kernels: The kernel package to build on (default: this checkout's, kernel_build.kernel_package()).
    """

    def __init__(self, model: str | ModelSource, options: ModelOptions = ModelOptions(), session=None,
                 kernels: KernelBuild | None = None) -> None:
        from max.engine import InferenceSession
        from max.graph import DeviceRef
        from max.nn.kv_cache import MHAKVCacheParams

        started = time.perf_counter()
        self.source = model if isinstance(model, ModelSource) else resolve_model(model)
        self.inventory = inventory(self.source)  # headers only: what the file holds, before the long part
        self.options = options
        self.device = max_device(options.device)  # before the weights load: a missing GPU fails at once
        self.config: ModelConfig = load_config(self.source)
        ref = DeviceRef.CPU() if options.device == "cpu" else DeviceRef.GPU()
        self.kv_params = MHAKVCacheParams(
            dtype=options.max_dtype, n_kv_heads=self.config.num_kv_heads, head_dim=self.config.head_dim,
            num_layers=self.config.num_layers, page_size=options.page_size, devices=[ref],
        )
        self.session = session or InferenceSession(devices=[self.device])
        decoder = compile_decoder(self.source, self.kv_params, ref, self.session, activations=options.activations,
                                  kernels=kernels, config=self.config, fuse_pairs=options.fuse_pairs)
        self.weights: ModelWeights = decoder.weights
        self.kernels, self.ops, self.model = decoder.kernels, decoder.ops, decoder.model
        self.compile_seconds = decoder.compile_seconds
        self.load_seconds = time.perf_counter() - started
        self.thread_tuner = CpuThreadTuner(options.tune_threads and options.device == "cpu")

    def load_line(self) -> str:
        """One line for the user: what the model holds, the load time and the peak resident memory, and
        which tensor types keep float activations when int8 activations were asked for."""
        from graphs.kernel_ops import Q8_ACT_QTYPES

        line = load_line(self.inventory, self.load_seconds)
        float_types = self.float_activation_types()
        if float_types:
            line += (f"; --activations q8 applies to {', '.join(sorted(t.upper() for t in Q8_ACT_QTYPES))} "
                     f"tensors, the {', '.join(float_types)} ones run float activations")
        return line

    def float_activation_types(self) -> list[str]:
        """Block formats of this model's matmuls that run float activations although options.activations
        is "q8" (the int8 path exists for kernel_ops.Q8_ACT_QTYPES); empty otherwise."""
        from graphs.kernel_ops import Q8_ACT_QTYPES

        if self.options.activations != "q8":
            return []
        w = self.weights
        linears = [w.lm_head] + [lin for layer in w.layers
                                 for lin in (*layer.qkv, layer.o_proj, *layer.gate_up, layer.down)]
        return sorted({lin.qtype.upper() for lin in linears if lin.qtype != "f32" and lin.qtype not in Q8_ACT_QTYPES})

    @property
    def provenance(self) -> dict[str, object]:
        """Which kernels this model runs (ours or MAX's), on which target, from which kernel build."""
        return {**summary(self.ops), "kernel_build": self.kernels.content_hash, "device": self.options.device,
                "dtype": self.options.compute_dtype, "activations": self.options.activations, "float_activation_types": self.float_activation_types(),
                "cpu_threads": self.thread_tuner.status}

    def execute(self, tokens: np.ndarray, row_offsets: np.ndarray, logit_rows: np.ndarray,
                kv_inputs: list, tokens_only: bool = False) -> np.ndarray:
        """Runs one step.

        Args:
            tokens: [T] int64 new tokens of all sequences, concatenated.
            row_offsets: [B + 1] uint32.
            logit_rows: [R] int64 rows (into tokens) whose next-token logits are wanted.
            kv_inputs: Flattened runtime KV inputs (tree.flatten of the manager's runtime_inputs).
            tokens_only: Return the argmax of each row, computed in the graph, instead of its logits
                (only [R] ids leave the device).

        Returns:
            [R, vocab] float32 logits, or [R] int64 token ids with tokens_only.
        """
        from max.driver import CPU, Buffer

        args = [Buffer.from_numpy(np.ascontiguousarray(a)).to(self.device)
                for a in (tokens.astype(np.int64), row_offsets.astype(np.uint32), logit_rows.astype(np.int64))]
        # MAX's KV cache manager stages cache_lengths and the page table into persistent device buffers
        # by an asynchronous copy (max.pipelines.graph_input_stager), and on CPU the graph does not
        # wait for it: about one decode step in 500 read the previous step's values (the new token's
        # K/V went to the wrong slot; logits moved by up to 3) whenever another thread kept a core
        # busy, e.g. the HTTP server's event loop. Wait for the copies to land first.
        self.device.synchronize()
        logits, ids = self.thread_tuner.execute(lambda: self.model.execute(*args, *kv_inputs))
        return (ids if tokens_only else logits).to(CPU()).to_numpy()
