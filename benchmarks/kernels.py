"""``crucible bench kernels``: every op at real model shapes, side by side with MAX's built-ins and numpy.

Shapes are those of SmolLM2-135M and of Llama-3-8B for M (tokens) in {1, 8, 64, 512}. Every row times
the systems interleaved in one process (benchmarks/timing.py) and reports medians, GFLOP/s, GB/s and
ratios. Reads come from DRAM, not a cache (benchmarks/cache_size.py): the read-bandwidth probe streams
4x the last-level cache sysfs reports, and every row rotates through distinct copies of its weights
(or paged KV) totalling that much, so no copy is still cached when its turn comes. The probe, also
timed beside the rows with a bandwidth target (a shared machine's read rate moves), gives the ceiling
of the memory-bound rows (kernel_targets._ceiling); a row that reads faster than the probe is flagged
(Row.over_probe). Times are per graph execution and include MAX's fixed per-execute cost, so the
decode target shapes also get "chain" rows: one graph running the op on distinct weight copies, as a
model's layers do. KernelBench.op_overhead measures the per-op dispatch and
hand-off in the same run, and each chain target states the fraction those leave attainable and the
fraction reached with the weights in cache (docs/benchmarks.md). The report is kernel_report.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from benchmarks.cache_size import ColdSize
from benchmarks.kernel_graphs import GraphSet
from benchmarks.kernel_row import Row
from benchmarks.timing import Timing, time_interleaved
from crucible.core.versions import cpu_info, describe_cpu

Target = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class ModelShapes:
    name: str
    hidden: int
    inter: int
    n_heads: int
    n_kv: int
    head_dim: int
    vocab: int

    def projections(self) -> list[tuple[str, int, int]]:
        """(name, K, N) of every linear layer of one decoder layer (plus the lm_head)."""
        qkv = (self.n_heads + 2 * self.n_kv) * self.head_dim
        rows = [("qkv", self.hidden, qkv), ("o_proj", self.n_heads * self.head_dim, self.hidden),
                ("gate_up", self.hidden, 2 * self.inter), ("down", self.inter, self.hidden)]
        if self.vocab * self.hidden <= 64 << 20:
            rows.append(("lm_head", self.hidden, self.vocab))
        return rows


SMOLLM2 = ModelShapes("smollm2-135m", 576, 1536, 9, 3, 64, 49152)
LLAMA3_8B = ModelShapes("llama-3-8b", 4096, 14336, 32, 8, 128, 128256)
M_VALUES = (1, 8, 64, 512)
CHAIN_MAX_OPS = 128  # ops in one chain graph; more weight sets rotate when the cold bytes need more
KV_MAX_COPIES = 64  # sequences a decode attention row rotates through (each holds its own pages)
QTYPES = ("q4_0", "q4_1", "q8_0")
# GPU chains (gpu_chain_rows): K = N = 4096, the decode GEMV (1), batched decode (8, 64) and prefill
# GEMM (512, 4096) rows; the Q4 formats at batch 1 in each read variant of kernels/qmatmul_gpu.mojo.
GPU_CHAIN_M = (1, 8, 64, 512, 4096)
GPU_CHAIN_QTYPES = ("q4_0", "q4_k")
GPU_QMATMUL_VARIANTS = ("lanes", "staged")
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}


class KernelBench:
    """Runs the rows for one target.

    Args:
        target: ``cpu`` or ``gpu``.
        quick: SmolLM2 shapes and the speed-target rows only.
        block_s: Seconds per timing block (benchmarks/timing.py); smaller for short device leases.
        prebuild: None to run the rows. Otherwise a dry run that compiles the graphs whose name it
            accepts into MAX's cache and times nothing real (bench_precompile.py); its rows are void.
        targets_only: Only the probe and the rows the speed targets are judged on (GPU: the chains
            and the 4096-key decode attention), for a device call with little time.
    """

    def __init__(self, target: Target, quick: bool = False, block_s: float = 0.15,
                 prebuild: Callable[[str], bool] | None = None, targets_only: bool = False) -> None:
        from max.engine import InferenceSession
        from max.graph import DeviceRef

        from crucible.core.devices import max_device
        from crucible.core.kernel_build import kernel_package
        from graphs.cpu_threads import CpuThreadTuner

        self.target = target
        self.quick = quick
        self.targets_only = targets_only
        self.device = max_device(target)
        self.ref = DeviceRef.CPU() if target == "cpu" else DeviceRef.GPU()
        self.session = InferenceSession(devices=[self.device])
        self.graphs = GraphSet(self.session, self.ref, kernel_package().path, {}, prebuild)
        self.rng = np.random.default_rng(0)
        self.rows: list[Row] = []
        self.extra: dict[str, float | str] = {}
        self.block_s = block_s
        self.skipped: list[str] = []
        self.cold = ColdSize.for_target(target)
        self.dry = prebuild is not None
        self.extra.update({"cache_bytes": self.cold.cache_bytes, "cold_bytes": self.cold.cold_bytes})
        # MAX's runtime threads get the priorities our models run with (graphs/cpu_threads.py), for
        # every system alike: they are process-wide, so MAX's ops and numpy run under them too.
        # (Not in a dry run: it finds MAX's threads by watching real executions.)
        self.threads = CpuThreadTuner(target == "cpu" and prebuild is None)

    # -- helpers -------------------------------------------------------------------------------
    def _buf(self, a: np.ndarray):
        """A device buffer holding its own copy of a (on the CPU, Buffer.from_numpy aliases a)."""
        from max.driver import Buffer

        return Buffer.from_numpy(np.array(a, order="C", copy=True)).to(self.device)

    def _copies(self, a: np.ndarray, cast: bool = False) -> list:
        """Distinct device copies of a that together stream the cold bytes (self.cold); a dry run
        gets one buffer (it times nothing). cast: in the target's float dtype (_cast)."""
        make = self._cast if cast else self._buf
        if self.dry:
            return [make(a)]
        return [make(a) for _ in range(self.cold.copies(a.nbytes))]

    def _chain_sets(self, xb, wq: np.ndarray, cast: bool = False) -> tuple[int, list[list], int]:
        """A chain's argument sets: (ops per graph, [x, one weight copy per op] per set, distinct
        copies), enough sets to stream the cold bytes (ColdSize.chain); a dry run gets one copy.
        cast: float weights in the target's float dtype (_cast)."""
        make = self._cast if cast else self._buf
        nbytes = wq.size * self.float_dtype.size_in_bytes if cast else wq.nbytes
        ops_n, sets = self.cold.chain(nbytes, CHAIN_MAX_OPS)
        bufs = [make(wq) for _ in range(1 if self.dry else ops_n * sets)]
        arg_sets = [[xb, *[bufs[(s * ops_n + i) % len(bufs)] for i in range(ops_n)]] for s in range(sets)]
        return ops_n, arg_sets, len(bufs)

    def _host_views(self, bufs: list) -> list[np.ndarray]:
        """numpy views of CPU buffers, so a numpy baseline rotates through the same copies."""
        return [b.to_numpy() for b in bufs]

    def _time(self, systems):
        return time_interleaved(systems, block_s=self.block_s)

    def _time_with_ceiling(self, systems) -> tuple[dict[str, Timing], float]:
        """Times `systems` with the read-bandwidth probe as one more interleaved system.

        This machine's memory bandwidth moves over time (shared host): the probe read 72 GB/s and
        40 GB/s in the same process seconds apart. A row's "% of read bandwidth" is only meaningful
        against a ceiling measured in the same rounds as the row itself.
        """
        probe, nbytes = self._probe_call()
        timings = self._time({**systems, "read_probe": probe})
        gbps = nbytes / timings.pop("read_probe").median / 1e9
        self._saw_read_rate(gbps, probe=True)
        return timings, gbps

    def _saw_read_rate(self, gbps: float, probe: bool = False) -> None:
        """Keeps the best read rate measured in this run: the ceiling every bandwidth target uses
        (and, for probe timings, the best probe: the rate a row must not beat, flag_over_probe)."""
        self.extra["read_ceiling_gbps"] = max(self.extra.get("read_ceiling_gbps", 0.0), gbps)
        if probe:
            self.extra["probe_best_gbps"] = max(self.extra.get("probe_best_gbps", 0.0), gbps)

    def _probe_call(self) -> tuple[callable, int]:
        if not hasattr(self, "_probe"):
            # CPU: the cold bytes, at least 256 MB; GPU: 4 GB, far beyond the L2.
            n = max(64 << 20, self.cold.cold_bytes // 4) if self.target == "cpu" else (1 << 30)
            if self.dry:
                n = 1 << 10  # a dry run times nothing; 16 workers x 4 GB would crowd the host's memory
            self._probe = (self._call(self.graphs.bandwidth(), [self._buf(np.ones(n, np.float32))]), n * 4)
        return self._probe

    def _sync(self) -> None:
        if self.target == "gpu":
            self.device.synchronize()

    def _call(self, model, args) -> callable:
        return self._cycle(model, [args])

    def _cycle(self, model, arg_sets: list[list]) -> callable:
        """A call that runs model on the next argument set each time (cold copies in turn)."""
        sets = itertools.cycle(arg_sets)

        def run():
            args = next(sets)
            self.threads.execute(lambda: model.execute(*args))
            self._sync()
        return run

    @staticmethod
    def _cycle_host(fn: Callable[[np.ndarray], object], arrays: list[np.ndarray]) -> callable:
        items = itertools.cycle(arrays)
        return lambda: fn(next(items))

    @property
    def float_dtype(self):
        from max.dtype import DType

        return DType.float32 if self.target == "cpu" else DType.bfloat16

    # -- rows ----------------------------------------------------------------------------------
    def probe(self) -> None:
        """Read bandwidth on a buffer of 4x the LLC, at least 256 MB (CPU), or of 4 GB (GPU)."""
        probe, nbytes = self._probe_call()
        t = time_interleaved({"probe": probe}, rounds=2, block_s=1.0)["probe"]
        self.extra["read_bandwidth_gbps"] = nbytes / t.median / 1e9
        self._saw_read_rate(self.extra["read_bandwidth_gbps"], probe=True)
        empty = self.graphs.empty()
        one = self._buf(np.ones(1, np.float32))
        t = time_interleaved({"empty": self._call(empty, [one])}, rounds=2, block_s=0.2)["empty"]
        self.extra["exec_overhead_us"] = t.median * 1e6
        self.extra.update(self.op_overhead())

    def op_overhead(self, copies: int = 64) -> dict[str, float]:
        """The fixed cost of one op inside a graph, the floor under every small decode row.

        Chains of `copies` + 1 and of 1 crucible.overhead_probe ops (x + 1, no work); the difference
        divided by `copies` leaves out the per-execute cost. op_dispatch_us: an op whose body runs on
        the calling runtime worker. parallel_handoff_us: what handing one empty item per core to the
        runtime's workers adds (every parallel CPU kernel pays it; on the GPU, a wider launch).
        phase_us: one phase boundary inside one hand-off (common.parallel_phases: one op of
        `copies` + 1 phases against one of 1), what a parallel op fused into its neighbour pays
        instead of its hand-off (on the GPU, one more launch).
        """
        one = self._buf(np.ones(1, np.float32))
        systems = {f"{kind}_{n}": self._call(self.graphs.overhead_chain(n, kind == "parallel"), [one])
                   for kind in ("serial", "parallel") for n in (1, copies + 1)}
        systems["phases"] = self._call(self.graphs.overhead_chain(1, True, copies + 1), [one])
        t = time_interleaved(systems, rounds=3, block_s=0.2)
        per_op = {kind: (t[f"{kind}_{copies + 1}"].median - t[f"{kind}_1"].median) / copies * 1e6
                  for kind in ("serial", "parallel")}
        return {"op_dispatch_us": per_op["serial"], "parallel_handoff_us": per_op["parallel"] - per_op["serial"],
                "phase_us": (t["phases"].median - t["parallel_1"].median) / copies * 1e6}

    def matmul_rows(self, model: ModelShapes, m: int, name: str, k: int, n: int) -> None:
        x = self.rng.standard_normal((m, k)).astype(np.float32)
        w = (self.rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
        dt = self.float_dtype
        xb, ws = self._cast(x), self._copies(w, cast=True)
        systems = {s: self._cycle(self.graphs.matmul(s, dt), [[xb, wb] for wb in ws]) for s in ("crucible", "max")}
        if self.target == "cpu":
            systems["numpy"] = self._cycle_host(lambda wh: x @ wh.T, self._host_views(ws))
        elem = 4 if self.target == "cpu" else 2
        row = Row("matmul", model.name, {"M": m, "K": k, "N": n}, name, str(dt), self.target,
                  2.0 * m * k * n, float(elem * (n * k + m * k + m * n)), rotated=len(ws))
        self.rows.append(row.fill(self._time(systems)))
        del ws

    def qmatmul_rows(self, model: ModelShapes, m: int, name: str, k: int, n: int, act: str = "f32") -> None:
        """crucible.qmatmul for each block format against fp32 matmuls of the dequantized weights, and
        for Q4_0 against MAX's own ops.qmatmul on the same bytes (max_q4_0).

        act "q8" times the int8-activation variant (CPU decode path, M <= 32; variant "name:qtype:q8").
        """
        from crucible.conformance.naive import dequantize, quantize

        x = self.rng.standard_normal((m, k)).astype(np.float32)
        w = (self.rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
        for qtype in QTYPES:
            wq = quantize(w, qtype)
            xb, wqs = self._buf(x), self._copies(wq)
            systems = {"crucible": self._cycle(self.graphs.qmatmul(qtype, act), [[xb, b] for b in wqs])}
            if self.target == "cpu":
                from max.dtype import DType

                wds = self._copies(dequantize(wq, qtype, n, k).astype(np.float32))
                for s_name in ("crucible", "max"):
                    systems[f"{s_name}_fp32"] = self._cycle(self.graphs.matmul(s_name, DType.float32),
                                                           [[xb, b] for b in wds])
                systems["numpy_fp32"] = self._cycle_host(lambda wh: x @ wh.T, self._host_views(wds))
                if qtype == "q4_0":  # MAX's quantized matmul on the same bytes (MAX reads Q4_0, Q4_K, Q6_K)
                    systems["max_q4_0"] = self._cycle(self.graphs.max_qmatmul_q4_0(), [[xb, b] for b in wqs])
            variant = f"{name}:{qtype}" + (":q8" if act == "q8" else "")
            row = Row("qmatmul", model.name, {"M": m, "K": k, "N": n}, variant, "float32",
                      self.target, 2.0 * m * k * n, float(n * k // 32 * BLOCK_BYTES[qtype] + 4 * (m * k + m * n)),
                      rotated=len(wqs))
            if name == "target":
                timings, probe_gbps = self._time_with_ceiling(systems)
                # The fp32 matmuls of this row stream the dequantized weights (4 n k bytes, cold copies)
                # in the same rounds; their read rate is DRAM bandwidth the machine provably had, and it
                # has exceeded the probe's (72 vs 45 GB/s in one run), so the ceiling is the larger.
                streamed = [4.0 * n * k / t.median / 1e9 for s_name, t in timings.items()
                            if s_name.endswith("_fp32")]
                row.ceiling_gbps = max([probe_gbps, *streamed])
                self._saw_read_rate(row.ceiling_gbps)
            else:
                timings = self._time(systems)
            self.rows.append(row.fill(timings))
            del wqs, systems

    def chain_rows(self, m: int, k: int, n: int) -> None:
        """Decode-sized matmuls as a model runs them: one graph of up to CHAIN_MAX_OPS ops in sequence,
        each with its own weight copy (GraphSet.chain), and as many distinct sets of those copies,
        rotated from one execute to the next, as it takes to stream the cold bytes (4x the LLC); time
        per op = time / ops, including a slice that feeds each output to the next op.

        A single small op (576 x 1536 in Q4 is 0.5 MB) takes less time than MAX's fixed per-execute
        cost (~17 us), which the one-op rows include; in a model, 120 such ops share one execute and
        read their weights from DRAM. Every system gets the same treatment.

        Each quantized chain also gets a "cached:" row: the same graph given one weight copy for
        every op, so the weights come from the caches and the time is the kernel's compute plus the
        per-op cost. Its bytes / time bounds what the DRAM chain could reach were every read hidden
        behind the compute (kernel_targets._in_cache_bound): it tells a compute-bound row from a
        memory-bound one.
        """
        from crucible.conformance.naive import quantize

        if m != 1:
            raise ValueError(f"chain rows are decode rows (M = 1), got M = {m}")
        x = self.rng.standard_normal((m, k)).astype(np.float32)
        w = (self.rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
        xb = self._buf(x)
        for qtype, act in (("q4_0", "f32"), ("q4_0", "q8"), ("q4_1", "f32"), ("q4_1", "q8"), ("f32", "f32")):
            wq = w if qtype == "f32" else quantize(w, qtype)
            ops_n, arg_sets, distinct = self._chain_sets(xb, wq)
            ours = self.graphs.chain("crucible", qtype, ops_n, k, wq.shape, act)
            systems = {"crucible": self._cycle(ours, arg_sets)}
            if qtype == "f32":
                systems["max"] = self._cycle(self.graphs.chain("max", "f32", ops_n, k, wq.shape), arg_sets)
            raw, ceiling = self._time_with_ceiling(systems)
            timings = _per_op(raw, ops_n)
            op = "matmul" if qtype == "f32" else "qmatmul"
            variant = "chain" if qtype == "f32" else f"chain:{qtype}" + (":q8" if act == "q8" else "")
            row = Row(op, "target", {"M": m, "K": k, "N": n, "copies": ops_n}, variant, "float32", self.target,
                      2.0 * m * k * n, float(wq.nbytes + 4 * (m * k + m * n)), ceiling_gbps=ceiling,
                      rotated=distinct)
            self.rows.append(row.fill(timings))
            if qtype != "f32":
                raw = self._time({"crucible": self._call(ours, [xb, *[arg_sets[0][1]] * ops_n])})
                cached = Row(op, "target", dict(row.shape), "cached:" + variant.split(":", 1)[1], "float32",
                             self.target, row.flops, row.bytes)
                self.rows.append(cached.fill(_per_op(raw, ops_n)))
            del arg_sets, systems

    def gpu_chain_rows(self, k: int = 4096, n: int = 4096) -> None:
        """The GPU kernel targets' rows, as chains (chain_rows): on a GPU one execute costs ~40 us, more
        than a 4096 x 4096 GEMV reads in, so a one-op row would time the overhead. Each chain streams
        4x the L2 in distinct weight copies within one execute; times are per op.

        bf16 matmul at every M of GPU_CHAIN_M, ours ("auto", what models run) against MAX's, and for
        M > 8 our opt-in tensor_core_vec as a third system; then
        crucible.qmatmul with bf16 activations at M = 1 for each format and read variant.
        """
        from max.dtype import DType

        w = (self.rng.standard_normal((n, k)) / math.sqrt(k)).astype(np.float32)
        bf16 = DType.bfloat16
        x1 = self._cast(self.rng.standard_normal((1, k)).astype(np.float32))
        ops_n, arg_sets, distinct = self._chain_sets(x1, w, cast=True)
        graphs = {s: self.graphs.chain(s, "f32", ops_n, k, (n, k), dtype=bf16) for s in ("crucible", "max")}
        # The opt-in tiles with vector fills (kernels/matmul_gpu.mojo), beside "auto" where auto tiles.
        vec = self.graphs.chain("crucible", "f32", ops_n, k, (n, k), dtype=bf16, variant="tensor_core_vec")
        for m in GPU_CHAIN_M:
            xb = self._cast(self.rng.standard_normal((m, k)).astype(np.float32))
            sets = [[xb, *a[1:]] for a in arg_sets]
            systems = {s: self._cycle(g, sets) for s, g in graphs.items()}
            if m > 8:
                systems["tc_vec"] = self._cycle(vec, sets)  # its ratio: tc_vec time / auto time
            raw, ceiling = self._time_with_ceiling(systems) if m == 1 else (self._time(systems), 0.0)
            row = Row("matmul", "target", {"M": m, "K": k, "N": n, "copies": ops_n}, "chain", str(bf16),
                      self.target, 2.0 * m * k * n, float(2 * (n * k + m * k + m * n)), ceiling_gbps=ceiling,
                      rotated=distinct)
            self.rows.append(row.fill(_per_op(raw, ops_n)))
        del arg_sets, graphs, vec
        from crucible.conformance.matmul_checks import quantized_weights

        for qtype in GPU_CHAIN_QTYPES:
            wq = quantized_weights(n, k, qtype, self.rng)  # random valid blocks for Q4_K
            ops_n, arg_sets, distinct = self._chain_sets(x1, wq)
            for variant in GPU_QMATMUL_VARIANTS:
                chain = self.graphs.chain("crucible", qtype, ops_n, k, wq.shape, dtype=bf16, variant=variant)
                raw, ceiling = self._time_with_ceiling({"crucible": self._cycle(chain, arg_sets)})
                row = Row("qmatmul", "target", {"M": 1, "K": k, "N": n, "copies": ops_n},
                          f"chain:{qtype}:{variant}", str(bf16), self.target, 2.0 * k * n,
                          float(wq.nbytes + 2 * (k + n)), ceiling_gbps=ceiling, rotated=distinct)
                self.rows.append(row.fill(_per_op(raw, ops_n)))
            del arg_sets

    def elementwise_rows(self, model: ModelShapes, m: int) -> None:
        dt = self.float_dtype
        h, i, d = model.hidden, model.inter, model.head_dim
        x = self._cast(self.rng.standard_normal((m, h)).astype(np.float32))
        w = self._cast(self.rng.standard_normal(h).astype(np.float32))
        systems = {s: self._call(self.graphs.rmsnorm(s, dt), [x, w]) for s in ("crucible", "max")}
        elem = 4 if self.target == "cpu" else 2
        self.rows.append(Row("rmsnorm", model.name, {"M": m, "H": h}, "", str(dt), self.target, 4.0 * m * h,
                             float(elem * 2 * m * h)).fill(self._time(systems)))
        delta = self._cast(self.rng.standard_normal((m, h)).astype(np.float32))
        systems = {s: self._call(self.graphs.add_rmsnorm(s, dt), [x, delta, w]) for s in ("crucible", "max")}
        self.rows.append(Row("add_rmsnorm", model.name, {"M": m, "H": h}, "", str(dt), self.target, 5.0 * m * h,
                             float(elem * 4 * m * h)).fill(self._time(systems)))
        self.qkv_rope_write_row(model, m)
        gu_host = self.rng.standard_normal((m, 2 * i)).astype(np.float32)
        systems = {"crucible": self._call(self.graphs.silu_mul("crucible", dt), [self._cast(gu_host)]),
                   "max": self._call(self.graphs.silu_mul("max", dt),
                                     [self._cast(gu_host[:, :i].copy()), self._cast(gu_host[:, i:].copy())])}
        self.rows.append(Row("silu_mul", model.name, {"M": m, "I": i}, "", str(dt), self.target, 6.0 * m * i,
                             float(elem * 3 * m * i)).fill(self._time(systems)))
        xr = self._cast(self.rng.standard_normal((m, model.n_heads, d)).astype(np.float32))
        offs = self._buf(np.array([0, m], np.uint32))
        start = self._buf(np.array([0], np.uint32))
        inv = (1.0 / 10000.0 ** (np.arange(0, d, 2) / d)).astype(np.float32)
        ang = np.arange(m + 1)[:, None] * inv[None, :]
        freqs = np.stack([np.cos(ang), np.sin(ang)], -1).reshape(m + 1, d).astype(np.float32)
        systems = {"crucible": self._call(self.graphs.rope("crucible", dt, d), [xr, offs, start, self._buf(inv)]),
                   "max": self._call(self.graphs.rope("max", dt, d), [xr, offs, start, self._buf(freqs)])}
        self.rows.append(Row("rope", model.name, {"M": m, "heads": model.n_heads, "D": d}, "half-split", str(dt),
                             self.target, 6.0 * m * model.n_heads * d / 2,
                             float(elem * 2 * m * model.n_heads * d)).fill(self._time(systems)))

    def qkv_rope_write_row(self, model: ModelShapes, m: int, cached: int = 100) -> None:
        """The fused qkv -> roped q + cache write op against the unfused ops it replaced, for one
        sequence of m new tokens after `cached` ones (positions cross a page boundary once m > 28)."""
        dt = self.float_dtype
        hq, hkv, d = model.n_heads, model.n_kv, model.head_dim
        pages = (cached + m) // 128 + 2
        lut = self._buf(np.arange(pages - 1, dtype=np.uint32)[None, ::-1].copy())
        blocks = self._cast(np.zeros((pages, 2, 1, 128, hkv, d), np.float32))
        qkv = self._cast(self.rng.standard_normal((m, (hq + 2 * hkv) * d)).astype(np.float32))
        inv = self._buf((1.0 / 10000.0 ** (np.arange(0, d, 2) / d)).astype(np.float32))
        args = [blocks, qkv, inv, self._buf(np.array([0, m], np.uint32)), self._buf(np.array([cached], np.uint32)), lut]
        elem = 4 if self.target == "cpu" else 2
        row = Row("qkv_rope_write", model.name, {"M": m, "Hq": hq, "Hkv": hkv, "D": d}, "half-split", str(dt),
                  self.target, 6.0 * m * (hq + hkv) * d / 2, float(elem * 2 * m * (hq + 2 * hkv) * d))
        try:
            systems = {s: self._call(self.graphs.qkv_rope_write(s, dt, hq, hkv, d), args)
                       for s in ("crucible", "unfused")}
            self.rows.append(row.fill(self._time(systems)))
        except Exception as exc:  # noqa: BLE001  (a bf16 cache buffer made here has never run on a GPU)
            self.skipped.append(f"qkv_rope_write {model.name} M={m} on {self.target}: {type(exc).__name__}: {exc}")

    def attention_rows(self, model: ModelShapes, new_tokens: int, cached: int) -> None:
        """One sequence: `new_tokens` queries over `cached` + new keys, from MAX's paged cache."""
        try:
            import max.pipelines.kv_cache  # noqa: F401  (needs MAX's serving dependencies, e.g. pydantic)
        except ImportError as exc:
            self.skipped.append(f"attention rows: MAX's KV cache manager is not importable ({exc})")
            return
        from max import tree
        from max.driver import CPU
        from max.nn.kv_cache import MHAKVCacheParams
        from max.pipelines.context import TextContext, TokenBuffer
        from max.pipelines.kv_cache import PagedKVCacheManager
        from max.pipelines.modeling.types import RequestID

        total = cached + new_tokens
        pages = total // 128 + 2
        elem = 4 if self.target == "cpu" else 2
        kv_bytes = 2.0 * total * model.n_kv * model.head_dim * elem
        # A decode row reads cold KV: on CPU it rotates through sequences of their own pages; on a GPU,
        # where one execute costs more than a layer's KV takes to read, one execute runs the op on
        # every layer of a deeper cache (GraphSet.attention) and the time is per layer. Prefill rows
        # are compute-bound.
        # (The layer count shapes the graph, so a dry run, which compiles it, keeps it.)
        cold = 1 if not cached else min(KV_MAX_COPIES, self.cold.copies(int(kv_bytes)))
        seqs, layers = (1 if self.dry else cold, 1) if self.target == "cpu" else (1, cold)
        params = MHAKVCacheParams(dtype=self.float_dtype, n_kv_heads=model.n_kv, head_dim=model.head_dim,
                                  num_layers=layers, page_size=128, devices=[self.ref])
        manager = PagedKVCacheManager(params=params, session=self.session, total_num_pages=pages * seqs,
                                      max_batch_size=seqs)
        ctxs, arg_sets = [], []
        q = self._cast(self.rng.standard_normal((new_tokens, model.n_heads, model.head_dim)).astype(np.float32))
        offs = self._buf(np.array([0, new_tokens], np.uint32))
        for _ in range(seqs):
            # A prefill row's context holds its new tokens as the prompt; a decode row's holds the
            # cached prompt, marked processed, then the new tokens appended one by one.
            ctx = TextContext(request_id=RequestID(), max_length=total + 8,
                              tokens=TokenBuffer(np.zeros(cached if cached else new_tokens, np.int64)))
            manager.claim(ctx)
            if cached:
                manager.alloc(ctx)
                ctx.update(0)  # the prompt counts as processed: the next step is the new tokens
                for _ in range(new_tokens - 1):
                    ctx.update(0)
            manager.alloc(ctx)
            kv_flat, _ = tree.flatten(manager.runtime_inputs([[ctx]]))
            # The page blocks are shared; the small inputs (lengths, page table) live in staging
            # memory the next runtime_inputs call rewrites, so each sequence keeps its own copy.
            arg_sets.append([q, offs, kv_flat[0], *[self._buf(b.to(CPU()).to_numpy()) for b in kv_flat[1:]]])
            ctxs.append(ctx)
        systems = {s: self._cycle(self.graphs.attention(s, params, model.n_heads), arg_sets)
                   for s in ("crucible", "max")}
        flops = 4.0 * new_tokens * model.n_heads * model.head_dim * (cached + (new_tokens + 1) / 2)
        row = Row("attention_paged", model.name, {"new": new_tokens, "cached": cached, "Hq": model.n_heads,
                                                  "Hkv": model.n_kv, "D": model.head_dim},
                  "decode" if new_tokens == 1 else "prefill", str(self.float_dtype), self.target, flops, kv_bytes,
                  rotated=seqs * layers)
        if new_tokens == 1 and cached == 4096:
            timings, row.ceiling_gbps = self._time_with_ceiling(systems)
        else:
            timings = self._time(systems)
        self.rows.append(row.fill(_per_op(timings, layers)))
        for ctx in ctxs:
            manager.release(ctx)

    def _cast(self, a: np.ndarray):
        """Host float32 array -> device buffer in the target's float dtype."""
        if self.target == "cpu":
            return self._buf(a.astype(np.float32))
        from crucible.core.bf16 import bf16_bits
        from max.dtype import DType

        return self._buf(bf16_bits(a)).view(DType.bfloat16)

    def run(self, log=print) -> list[Row]:
        self.probe()
        self.extra["cpu_threads"] = self.threads.status
        log(f"CPU: {describe_cpu(cpu_info())}")
        log(f"read bandwidth {self.extra['read_bandwidth_gbps']:.1f} GB/s, "
            f"execute overhead {self.extra['exec_overhead_us']:.1f} us, per op in a graph: dispatch "
            f"{self.extra['op_dispatch_us']:.2f} us + parallel hand-off {self.extra['parallel_handoff_us']:.2f} us "
            f"(a phase boundary inside one hand-off: {self.extra['phase_us']:.2f} us), "
            f"CPU threads: {self.threads.status}")
        if self.targets_only and self.target == "gpu":
            self.gpu_chain_rows()
            log(f"  chains done ({len(self.rows)} rows)")
            self.attention_rows(LLAMA3_8B, 1, 4096)
            return self._finish()
        models = [SMOLLM2] if self.quick else [SMOLLM2, LLAMA3_8B]
        # The speed-target shapes first, so a quick run always has them.
        for m, k, n in ((512, 1536, 1536), (1, 576, 1536), (1, 4096, 4096)):
            self.matmul_rows(ModelShapes("target", k, 0, 0, 0, 0, 0), m, "target", k, n)
        log(f"  target matmul done ({len(self.rows)} rows)")
        for m, k, n in ((1, 4096, 4096), (1, 576, 1536)):
            for act in ("f32", "q8") if self.target == "cpu" else ("f32",):
                self.qmatmul_rows(ModelShapes("target", k, 0, 0, 0, 0, 0), m, "target", k, n, act)
        log(f"  target qmatmul done ({len(self.rows)} rows)")
        if self.target == "cpu":
            for k, n in ((576, 1536), (4096, 4096)):
                self.chain_rows(1, k, n)
        else:
            self.gpu_chain_rows()
        log(f"  chains done ({len(self.rows)} rows)")
        self.attention_rows(LLAMA3_8B, 1, 4096)
        log(f"  target attention done ({len(self.rows)} rows)")
        for model in models:
            for m in M_VALUES:
                for name, k, n in model.projections():
                    if model is LLAMA3_8B and m == 512 and self.target == "cpu" and name == "gate_up":
                        continue  # 120 GFLOP per call: minutes of CPU time for one row
                    self.matmul_rows(model, m, name, k, n)
                    self.qmatmul_rows(model, m, name, k, n)
                self.elementwise_rows(model, m)
                log(f"  {model.name} M={m} done ({len(self.rows)} rows)")
            for cached in (512, 4096):
                self.attention_rows(model, 1, cached)
            for m in (64, 512):
                self.attention_rows(model, m, 0)
        return self._finish()

    def _finish(self) -> list[Row]:
        if self.skipped:
            self.extra["skipped"] = list(self.skipped)
        flag_over_probe(self.rows, float(self.extra.get("probe_best_gbps", 0.0)))
        return self.rows


def flag_over_probe(rows: list[Row], probe_gbps: float) -> None:
    """Marks, in each row, the systems that read faster than the best probe of the run: their bytes
    came (partly) from a cache, so the row does not measure DRAM. "cached:" rows are in cache on
    purpose and are left unmarked."""
    if probe_gbps <= 0:
        return
    for row in rows:
        if not row.variant.startswith("cached:"):
            row.over_probe = sorted(name for name, gbps in row.gbps.items() if gbps > probe_gbps)


def _per_op(raw: dict[str, Timing], copies: int) -> dict[str, Timing]:
    """A chain's timings (one execute of `copies` ops) per op."""
    return {name: t.scaled(1.0 / copies) for name, t in raw.items()}
