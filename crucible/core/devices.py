"""The MAX device a run asks for, with one clear error where the machine has no GPU.

MAX's ``Accelerator()`` on a machine without one raises deep inside a job with CUDA/HIP/Metal probing
output; every place that opens a device goes through ``max_device`` instead, and the command line
checks ``gpu_count`` before it loads anything.
"""

from __future__ import annotations

NO_GPU = ("a GPU was asked for, but MAX sees no accelerator on this machine (max.driver.accelerator_count() == 0); "
          "run on a machine with an NVIDIA or AMD GPU, or use the cpu target")


# Compute dtypes a model may be built in; "auto" is float32 on CPU and bfloat16 on GPU (graphs/model.py).
DTYPES = ("auto", "float32", "bfloat16")


class NoGPUError(RuntimeError):
    """A GPU device was asked for on a machine where MAX sees none."""


def gpu_count() -> int:
    """Accelerators MAX can see (0 on a CPU-only machine)."""
    from max.driver import accelerator_count

    return int(accelerator_count())


def max_device(kind: str):
    """The MAX driver device for ``kind``.

    Args:
        kind: "cpu" or "gpu".

    Returns:
        ``max.driver.CPU()`` or ``max.driver.Accelerator()``.

    Raises:
        NoGPUError: kind is "gpu" and MAX sees no accelerator.
        ValueError: kind is neither.
    """
    from max.driver import CPU, Accelerator

    if kind == "cpu":
        return CPU()
    if kind != "gpu":
        raise ValueError(f"device kind must be 'cpu' or 'gpu', got {kind!r}")
    if gpu_count() == 0:
        raise NoGPUError(NO_GPU)
    return Accelerator()
