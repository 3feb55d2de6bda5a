"""The version matrix every record carries: software versions, the kernel build and the hardware."""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from crucible.proc import child_env


def _pkg(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_info() -> dict[str, object]:
    """CPU model, core count and the SIMD flags that decide kernel code paths."""
    model, flags = platform.processor() or "unknown", ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        if m := re.search(r"^model name\s*:\s*(.+)$", text, re.M):
            model = m.group(1).strip()
        if m := re.search(r"^flags\s*:\s*(.+)$", text, re.M):
            flags = m.group(1)
    except OSError:
        pass
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "amx_tile", "neon")
    import os

    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "simd_flags": [f for f in wanted if re.search(rf"\b{f}\b", flags)],
        "machine": platform.machine(),
    }


def gpu_info() -> dict[str, object] | None:
    """GPU name and driver from nvidia-smi (or rocm-smi), None when neither answers."""
    for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                ["rocm-smi", "--showproductname", "--showdriverversion"]):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, env=child_env())
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            line = out.stdout.strip().splitlines()[0]
            if cmd[0] == "nvidia-smi":
                name, driver, mem = [p.strip() for p in line.split(",")]
                return {"name": name, "driver": driver, "memory": mem, "vendor": "nvidia"}
            return {"name": line, "vendor": "amd", "raw": out.stdout.strip()[:500]}
    return None


def version_matrix(target: str = "cpu") -> dict[str, object]:
    """Versions of python, max, mojo, transformers and numpy, the kernel build hash and the hardware."""
    from crucible.kernel_build import kernel_package

    build = kernel_package()
    matrix: dict[str, object] = {
        "python": sys.version.split()[0],
        "max": _pkg("max"),
        "modular": _pkg("modular"),
        "mojo": build.mojo_version,
        "transformers": _pkg("transformers"),
        "numpy": _pkg("numpy"),
        "torch": _pkg("torch"),
        "crucible": _pkg("crucible"),
        "kernel_build": build.content_hash,
        "target": target,
        "cpu": cpu_info(),
    }
    if target == "gpu":
        matrix["gpu"] = gpu_info()
    return matrix
