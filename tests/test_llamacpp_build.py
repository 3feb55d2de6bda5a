"""The llama.cpp baseline's build flags and cache check (nothing is built here)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.llamacpp import NO_AMX_FLAGS, TARGETS, cmake_flags, exit_status, is_built


def test_x86_builds_leave_amx_out_and_arm_builds_take_no_x86_flags() -> None:
    x86 = cmake_flags("x86_64")
    assert f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}" in x86 and f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}" in x86
    assert "-DGGML_NATIVE=ON" in x86
    arm = cmake_flags("aarch64")
    assert not any("amx" in f for f in arm) and "-DGGML_NATIVE=ON" in arm


def _cache(tmp_path: Path, flags: list[str]) -> Path:
    (tmp_path / "bin").mkdir(parents=True)
    for t in TARGETS:
        (tmp_path / "bin" / t).write_text("")
    (tmp_path / "build-info.json").write_text(json.dumps({"source": "s", "build_seconds": 1.0, "cmake_flags": flags}))
    return tmp_path


def test_a_build_with_other_flags_is_not_reused(tmp_path: Path) -> None:
    assert is_built(_cache(tmp_path / "now", list(cmake_flags())))
    old = list(cmake_flags())[:-1]  # e.g. a build from before x86 builds left AMX out
    assert not is_built(_cache(tmp_path / "old", old))
    assert not is_built(tmp_path / "missing")


def test_exit_status_names_the_signal() -> None:
    assert exit_status(1) == "exit 1"
    assert exit_status(-11) == "signal 11 (SIGSEGV)"
