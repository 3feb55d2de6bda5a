"""crucible.qmatmul2 and crucible.mlp against the ops they replace, batch 1, in one process, interleaved rounds.

    .venv/bin/python -m benchmarks.qmatmul2_ab --pattern mlp --qtype q5_0 --act q8
    .venv/bin/python -m benchmarks.qmatmul2_ab --pattern qkv --act q8
    .venv/bin/python -m benchmarks.qmatmul2_ab --pattern mlp_op --qtype q5_0 --act q8

Each graph chains one pattern over `layers` layers of random weights, SmolLM2's widths (H 576, I 1536,
q|k 768 + v 192), so a decode step's worth of them runs per execute:
  mlp: x -> act(x @ gate^T) * (x @ up^T) -> @ down^T -> x    (unfused: qmatmul, qmatmul, concat, silu_mul)
  qkv: x -> [x @ (q|k)^T | x @ v^T] (Q5_0 + Q8_0, as in SmolLM2's Q4_K_M) -> @ o^T -> x
                                                           (unfused: qmatmul, qmatmul, concat)
  mlp_op: the mlp pattern as one crucible.mlp (kernels/mlp.mojo: one hand-off of two phases)
                                                           (unfused: qmatmul2 gated, then qmatmul)
The two graphs must give the same output; the score per round is the median execute time, and the
graphs take turns going first in a round.
benchmarks/kernel_ab.py --unfused-a measures the same change inside the whole model, where this
host's drift between rounds is larger than the difference.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

H, INTER, QK, V = 576, 1536, 768, 192


@dataclass(frozen=True)
class PatternConfig:
    """What to run.

    Attributes:
        pattern: "mlp", "qkv" or "mlp_op".
        qtype: Block format of every weight of "mlp" and "mlp_op" (qkv is Q5_0 + Q8_0, then a Q5_0 o).
        act: The qmatmuls' activation form, "f32" or "q8".
        layers: Patterns chained per graph.
        rounds: Interleaved rounds per graph.
        reps: Executes per round.
    """

    pattern: str = "mlp"
    qtype: str = "q5_0"
    act: str = "q8"
    layers: int = 30
    rounds: int = 15
    reps: int = 50

    def __post_init__(self) -> None:
        if self.pattern not in ("mlp", "qkv", "mlp_op"):
            raise ValueError(f"pattern must be mlp, qkv or mlp_op, got {self.pattern!r}")
        if self.act not in ("f32", "q8"):
            raise ValueError(f"act must be f32 or q8, got {self.act!r}")
        if self.layers < 1 or self.rounds < 1 or self.reps < 1:
            raise ValueError("need layers, rounds and reps >= 1")


def _weights(cfg: PatternConfig, rng: np.random.Generator) -> list[np.ndarray]:
    from crucible.conformance import naive as R

    def q(n: int, k: int, qtype: str) -> np.ndarray:
        # std 1 / sqrt(K): each projection keeps x's scale, so 30 chained layers stay finite
        return R.quantize((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), qtype)

    out = []
    for _ in range(cfg.layers):
        if cfg.pattern in ("mlp", "mlp_op"):
            out += [q(INTER, H, cfg.qtype), q(INTER, H, cfg.qtype), q(H, INTER, cfg.qtype)]
        else:
            out += [q(QK, H, "q5_0"), q(V, H, "q8_0"), q(H, QK + V, "q5_0")]
    return out


def _graph(cfg: PatternConfig, weights: list[np.ndarray], fused: bool, kernels_path):
    from max.dtype import DType
    from max.graph import DeviceRef, Graph, TensorType, ops

    from graphs import kernel_ops as K

    ref = DeviceRef.CPU()
    types = [TensorType(DType.float32, [1, H], device=ref)]
    types += [TensorType(DType.uint8, list(w.shape), device=ref) for w in weights]
    with Graph(f"{cfg.pattern}_{'fused' if fused else 'unfused'}", input_types=types,
               custom_extensions=[kernels_path]) as g:
        x = g.inputs[0].tensor  # [1, H]
        for layer in range(cfg.layers):
            a, b, out_w = (g.inputs[1 + 3 * layer + j].tensor for j in range(3))
            if cfg.pattern == "mlp_op":
                qt = cfg.qtype
                if fused:
                    x = K.mlp(x, a, b, out_w, INTER, H, qt, qt, qt, cfg.act, "silu")  # [1, H]
                else:
                    x = K.qmatmul(K.qmatmul2(x, a, b, INTER, INTER, H, qt, qt, cfg.act, "silu"), out_w, H, INTER, qt,
                                  cfg.act)
            elif cfg.pattern == "mlp":
                qt = cfg.qtype
                if fused:
                    h = K.qmatmul2(x, a, b, INTER, INTER, H, qt, qt, cfg.act, "silu")  # [1, I]
                else:
                    h = K.silu_mul(ops.concat([K.qmatmul(x, a, INTER, H, qt, cfg.act),
                                               K.qmatmul(x, b, INTER, H, qt, cfg.act)], axis=1))
                x = K.qmatmul(h, out_w, H, INTER, qt, cfg.act)
            else:
                if fused:
                    h = K.qmatmul2(x, a, b, QK, V, H, "q5_0", "q8_0", cfg.act, "cat")  # [1, QK + V]
                else:
                    h = ops.concat([K.qmatmul(x, a, QK, H, "q5_0", cfg.act), K.qmatmul(x, b, V, H, "q8_0", cfg.act)],
                                   axis=1)
                x = K.qmatmul(h, out_w, H, QK + V, "q5_0", cfg.act)
        g.output(x)
    return g


def run(cfg: PatternConfig, log=print) -> tuple[list[float], list[float]]:
    """Median execute time (ms) per round of the unfused and the fused graph."""
    from max.driver import CPU, Buffer
    from max.engine import InferenceSession

    from crucible.core.kernel_build import kernel_package

    rng = np.random.default_rng(0)
    weights = _weights(cfg, rng)
    kernels = kernel_package()
    session = InferenceSession(devices=[CPU()])
    models = [session.load(_graph(cfg, weights, fused, kernels.path)) for fused in (False, True)]
    x = rng.standard_normal((1, H)).astype(np.float32)
    bufs = [Buffer.from_numpy(x)] + [Buffer.from_numpy(w) for w in weights]
    outs = [m.execute(*bufs)[0].to_numpy() for m in models]
    if not np.isfinite(outs[0]).all() or not np.array_equal(outs[0], outs[1]):
        raise RuntimeError(f"fused and unfused outputs differ by {np.abs(outs[0] - outs[1]).max():.3g}")
    log(f"kernel build {kernels.content_hash}; outputs equal")
    rounds: tuple[list[float], list[float]] = ([], [])
    for r in range(cfg.rounds):
        # The graphs take turns going first, so neither always runs right after the other.
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            m = models[i]
            times = []
            for _ in range(cfg.reps):
                t0 = time.perf_counter()
                m.execute(*bufs)
                times.append(time.perf_counter() - t0)
            rounds[i].append(float(np.median(times)) * 1e3)
    return rounds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.qmatmul2_ab", description=__doc__.split("\n")[0])
    p.add_argument("--pattern", choices=("mlp", "qkv", "mlp_op"), default="mlp")
    p.add_argument("--qtype", default="q5_0", help="mlp, mlp_op: every weight's block format")
    p.add_argument("--act", choices=("f32", "q8"), default="q8")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args(argv)
    cfg = PatternConfig(args.pattern, args.qtype, args.act, args.layers, args.rounds)
    unfused, fused = run(cfg, log=lambda m: print(m, flush=True))
    what = f"{cfg.pattern} ({'q5_0 + q8_0' if cfg.pattern == 'qkv' else cfg.qtype}), act {cfg.act}"
    print(f"{what}, {cfg.layers} layers per execute, batch 1, {cfg.rounds} interleaved rounds of {cfg.reps} executes")
    print("unfused ms: " + " ".join(f"{v:.3f}" for v in unfused))
    print("fused ms:   " + " ".join(f"{v:.3f}" for v in fused))
    wins = sum(f < u for u, f in zip(unfused, fused))
    print(f"median unfused {np.median(unfused):.3f} ms, fused {np.median(fused):.3f} ms: "
          f"fused / unfused {np.median(fused) / np.median(unfused):.3f}, fused faster in {wins} of {cfg.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
