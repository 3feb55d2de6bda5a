"""The version matrix every record carries: software versions, the kernel build and the hardware."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from crucible.core.proc import child_env


def _pkg(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# AMD families and model ranges by core generation (AMD's revision guides): the "model name" of a
# VM is often just "AMD EPYC", and Zen 4 (256-bit FMA pipes, AVX-512 double-pumped) and Zen 5 (512-bit
# pipes) both report AVX-512 and VNNI while their compute peaks differ by 2x.
_AMD_CORES: tuple[tuple[int, range, str], ...] = (
    (23, range(0x00, 0x30), "zen1"),
    (23, range(0x30, 0x100), "zen2"),
    (25, range(0x00, 0x10), "zen3"),
    (25, range(0x10, 0x20), "zen4"),
    (25, range(0x20, 0x60), "zen3"),
    (25, range(0x60, 0x80), "zen4"),
    (25, range(0xA0, 0xB0), "zen4"),
    (26, range(0x00, 0x100), "zen5"),
)

# SIMD features that pick kernel code paths (kernels/qdot_int8.mojo, qgemv_rows_q8.mojo,
# gemm_cpu.mojo), as /proc/cpuinfo spells them on x86 ("flags") and aarch64 ("Features").
_SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_vnni", "avx512vbmi", "gfni",
               "amx_tile", "asimd", "asimddp", "sve")


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"^{name}\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip() if m else None


def core_name(vendor: str | None, family: int | None, model: int | None) -> str | None:
    """The core generation ("zen4", ...) of an AMD CPU from its family and model, else None."""
    if vendor != "AuthenticAMD" or family is None or model is None:
        return None
    for fam, models, name in _AMD_CORES:
        if family == fam and model in models:
            return name
    return None


def cpu_info(cpuinfo_text: str | None = None) -> dict[str, object]:
    """CPU model, family / model / stepping, core generation, core count and the SIMD flags that
    decide kernel code paths.

    Args:
        cpuinfo_text: /proc/cpuinfo's text; read from the machine when None.

    Returns:
        {"model", "vendor", "family", "model_number", "stepping", "core", "logical_cpus",
        "simd_flags", "machine"}; fields the machine does not report are None.
    """
    if cpuinfo_text is None:
        try:
            cpuinfo_text = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo_text = ""

    def number(name: str) -> int | None:
        # x86 prints these in decimal; some kernels print hex ids with a 0x prefix.
        value = _field(cpuinfo_text, name) or ""
        if re.fullmatch(r"0x[0-9a-fA-F]+", value):
            return int(value, 16)
        return int(value) if value.isdigit() else None

    vendor = _field(cpuinfo_text, "vendor_id")
    family, model_number = number("cpu family"), number("model")
    flags = _field(cpuinfo_text, "flags") or _field(cpuinfo_text, "Features") or ""
    return {
        "model": _field(cpuinfo_text, "model name") or platform.processor() or "unknown",
        "vendor": vendor,
        "family": family,
        "model_number": model_number,
        "stepping": number("stepping"),
        "core": core_name(vendor, family, model_number),
        "logical_cpus": os.cpu_count(),
        "simd_flags": [f for f in _SIMD_FLAGS if re.search(rf"\b{f}\b", flags)],
        "machine": platform.machine(),
    }


def describe_cpu(info: dict[str, object]) -> str:
    """One line for reports: "AMD EPYC (zen4, family 25 model 17), 2 logical CPUs, SIMD avx2, ..."."""
    ident = [str(info["core"])] if info.get("core") else []
    if info.get("family") is not None:
        ident.append(f"family {info['family']} model {info.get('model_number')}")
    where = f" ({', '.join(ident)})" if ident else ""
    flags = ", ".join(info.get("simd_flags") or []) or "none"  # type: ignore[arg-type]
    return f"{info['model']}{where}, {info['logical_cpus']} logical CPUs, SIMD {flags}"


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
    from crucible.core.kernel_build import kernel_package

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
