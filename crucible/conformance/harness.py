"""Compiles one graph per (op group, dtype) with symbolic dims and runs a shape grid through it.

The same harness runs on CPU (pytest, ``crucible qualify``) and on a GPU (the device check), so an
op's support on a target is established by the same grid and bounds everywhere. Graph inputs are
always float32/uint arrays; for bf16 the graph casts on entry and exit, and callers round the inputs
to bf16 first (``round_bf16``) so the float64 reference sees exactly the values the kernel saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from crucible.core.kernel_build import kernel_package

Target = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class CaseResult:
    """One grid point of one op.

    Attributes:
        op: Op name (``crucible.matmul`` ...).
        variant: Compile-time variant or qtype.
        dtype: Compute dtype on the target.
        shape: Human-readable shape of the case.
        max_err: Largest |kernel - reference| (or its ratio to the per-element bound, see bound).
        bound: The tolerance the case was held to.
        passed: max_err <= bound.
        target: ``cpu`` or ``gpu``.
    """

    op: str
    variant: str
    dtype: str
    shape: str
    max_err: float
    bound: float
    passed: bool
    target: str


class Harness:
    """A MAX session on one target with a cache of compiled graphs.

    Args:
        target: ``cpu`` or ``gpu`` (the first accelerator).
        compile_only: Compile graphs without loading them (virtual GPU devices cannot run).
        only: Build only these graph keys; `model` returns None for the others (used to spread a
            grid's graphs over worker processes, see precompile.py). None builds every graph.
    """

    def __init__(self, target: Target, compile_only: bool = False, only: frozenset[str] | None = None) -> None:
        from max.engine import InferenceSession
        from max.graph import DeviceRef

        from crucible.core.devices import max_device

        self.target = target
        self.compile_only = compile_only
        self.device = max_device(target)
        self.ref = DeviceRef.CPU() if target == "cpu" else DeviceRef.GPU()
        self.session = InferenceSession(devices=[self.device])
        self.kernels = kernel_package()
        self.only = only
        self._models: dict[str, object] = {}
        self.compile_seconds: dict[str, float] = {}
        # Every key asked for, built or not, in first-asked order.
        self.requested: list[str] = []

    def model(self, key: str, input_types: Sequence[object], build: Callable[..., Sequence[object]]):
        """Returns the compiled graph `key`, building it with `build(*graph_inputs)` on first use."""
        from max.graph import Graph

        if key not in self.requested:
            self.requested.append(key)
        if self.only is not None and key not in self.only:
            return None
        if key not in self._models:
            start = time.perf_counter()
            with Graph(key, input_types=list(input_types), custom_extensions=[self.kernels.path]) as g:
                g.output(*build(*g.inputs))
            self._models[key] = self.session.compile(g) if self.compile_only else self.session.load(g)
            self.compile_seconds[key] = time.perf_counter() - start
        return self._models[key]

    def run(self, model, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Executes with host arrays, returns host arrays."""
        from max.driver import CPU, Buffer

        bufs = [Buffer.from_numpy(np.ascontiguousarray(a)).to(self.device) for a in arrays]
        outs = model.execute(*bufs)
        return [o.to(CPU()).to_numpy() for o in outs]

    def run_buffers(self, model, buffers: Sequence[object]) -> list[np.ndarray]:
        """Executes with prepared device buffers (for in-place buffer inputs), returns host arrays."""
        from max.driver import CPU

        return [o.to(CPU()).to_numpy() for o in model.execute(*buffers)]

    def to_device(self, a: np.ndarray):
        from max.driver import Buffer

        return Buffer.from_numpy(np.ascontiguousarray(a)).to(self.device)


def result(h: Harness, op: str, variant: str, dtype: str, shape: str, err: float, bound: float) -> CaseResult:
    """Builds a CaseResult; NaN errors fail."""
    ok = bool(np.isfinite(err) and err <= bound)
    return CaseResult(op, variant, dtype, shape, float(err), float(bound), ok, h.target)
