"""llama.cpp as a baseline: `llama-bench` and `llama-server`, built from the llama-cpp-python sdist, and
`llama-quantize`, which makes the benchmarks' and tests' GGUF variants (Q4_K_M and the other presets).

The sdist vendors a pinned llama.cpp; it is fetched with pip (the package index is reachable where
PyPI is), built once with cmake (Release, native CPU flags) and cached with a record of how long
the build took. Nothing here runs unless a benchmark asks for llama.cpp.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
TARGETS = ("llama-bench", "llama-server", "llama-quantize")


class LlamaCppError(RuntimeError):
    """Fetching, building or running llama.cpp failed."""


@dataclass(frozen=True)
class LlamaCppBuild:
    """A cached llama.cpp build.

    Attributes:
        bin_dir: Folder with llama-bench and llama-server.
        source: The sdist it came from.
        build_seconds: Wall time of the cmake configure + build when it was made.
        built_now: Whether this call built it (else it was reused from the cache).
        cmake_flags: The configure flags.
    """

    bin_dir: Path
    source: str
    build_seconds: float
    built_now: bool
    cmake_flags: tuple[str, ...]

    def binary(self, name: str) -> Path:
        return self.bin_dir / name


def default_cache_dir() -> Path:
    """<crucible cache>/llama.cpp/<sdist version>."""
    from crucible.core.tokenizer import cache_dir

    return cache_dir() / "llama.cpp" / LLAMA_CPP_PYTHON_VERSION


def _current_record(cache: Path) -> dict | None:
    """The build record in `cache` if its binaries are there and it was built with today's flags."""
    record = cache / "build-info.json"
    if not record.is_file() or not all((cache / "bin" / t).exists() for t in TARGETS):
        return None
    try:
        info = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("cmake_flags") == list(cmake_flags()) else None


def is_built(cache_dir: Path | None = None) -> bool:
    """Whether a finished build with today's flags is cached (ensure_built would not build)."""
    return _current_record(cache_dir or default_cache_dir()) is not None


# ggml's AMX backend, which -march=native turns on wherever the CPU reports AMX, crashed llama-bench at
# its first matmul (a #GP in `ldtilecfg` on a tile config holding garbage; a known llama.cpp bug) on
# a VM where AMX itself works. x86 builds therefore leave AMX out (explicit -mno-* flags win over
# -march=native in either order), and llama.cpp runs its AVX-512 / AVX2 kernels, as on any host
# without AMX. The record's `cmake_flags` say so.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def cmake_flags(machine: str | None = None) -> tuple[str, ...]:
    """The configure flags for a build on `machine` (platform.machine() when None)."""
    flags = (
        "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON",           # -march=native: the CPU flags this machine has
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_OPENSSL=OFF",        # loopback benchmarks only
        "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download of the web UI
    )
    if (machine or platform.machine()).lower() in ("x86_64", "amd64"):
        flags += (f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}")
    return flags


def ensure_built(cache_dir: Path | None = None, log=print) -> LlamaCppBuild:
    """Returns the cached build, building it first if needed (4-15 minutes on 2 cores).

    A cached build made with other flags (cmake_flags()) is rebuilt.

    Raises:
        LlamaCppError: pip, cmake or the compiler failed (the message has the tail of the log).
    """
    cache = cache_dir or default_cache_dir()
    record = cache / "build-info.json"
    bin_dir = cache / "bin"
    info = _current_record(cache)
    if info is not None:
        return LlamaCppBuild(bin_dir, info["source"], info["build_seconds"], False, tuple(info["cmake_flags"]))
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise LlamaCppError(f"building llama.cpp needs `{tool}` on PATH")
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    source = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    log(f"llama.cpp: fetching the {source} sdist ...")
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", source, "-d", str(work)],
         work / "pip.log")
    sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    src = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
    log(f"llama.cpp: building {', '.join(TARGETS)} (cmake, Release, native; 4-15 min on 2 cores) ...")
    start = time.perf_counter()
    flags = cmake_flags()
    _run(["cmake", "-S", str(src), "-B", str(work / "build"), *flags], work / "configure.log")
    _run(["cmake", "--build", str(work / "build"), "--target", *TARGETS, "-j", str(os.cpu_count() or 2)],
         work / "build.log")
    seconds = time.perf_counter() - start
    staged = work / "bin"
    staged.mkdir()
    for t in TARGETS:
        shutil.copy2(work / "build" / "bin" / t, staged / t)
    if bin_dir.exists():
        shutil.rmtree(bin_dir)
    staged.rename(bin_dir)
    record.write_text(json.dumps({"source": source, "build_seconds": round(seconds, 1),
                                  "cmake_flags": list(flags), "machine": platform.processor() or platform.machine(),
                                  "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    log(f"llama.cpp: built in {seconds:.0f} s, cached in {cache}")
    return LlamaCppBuild(bin_dir, source, seconds, True, flags)


def exit_status(returncode: int) -> str:
    """"exit 1", or "signal 11 (SIGSEGV)" for a process the signal killed (subprocess's negative codes)."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        return f"signal {-returncode} ({signal.Signals(-returncode).name})"
    except ValueError:
        return f"signal {-returncode}"


def _run(cmd: list[str], log_path: Path) -> None:
    with log_path.open("w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise LlamaCppError(f"`{' '.join(cmd[:4])} ...` failed ({exit_status(proc.returncode)}); log {log_path}:\n{tail}")


@dataclass(frozen=True)
class LlamaBenchResult:
    """llama-bench's pp<N> or tg<N> row: tokens per second over its repetitions."""

    test: str
    n_prompt: int
    n_gen: int
    tok_s_samples: tuple[float, ...]
    build_commit: str
    flash_attn: int = -1   # llama-bench's -fa of this row (-1: not reported)
    depth: int = 0         # tokens already in the context before the test (-d)


def llama_bench(build: LlamaCppBuild, gguf: Path, *, n_prompt: int, n_gen: int, threads: int,
                repetitions: int, depth: int = 0, flash_attn: tuple[int, ...] = (0, 1)) -> list[LlamaBenchResult]:
    """Runs llama-bench once (pp n_prompt and tg n_gen, `repetitions` each, after `depth` tokens of
    context, for each -fa setting) and returns its rows.

    Both flash-attention settings by default: which is faster depends on the host and the depth (at
    depth 512 on a 2-vCPU Intel VM, -fa 1 decoded Q4_0 at 83 tok/s and -fa 0 at 207), so a comparison
    takes the faster of the two (best_rows).
    """
    cmd = [str(build.binary("llama-bench")), "-m", str(gguf), "-p", str(n_prompt), "-n", str(n_gen),
           "-t", str(threads), "-r", str(repetitions), "-d", str(depth),
           "-fa", ",".join(str(f) for f in flash_attn), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LlamaCppError(f"llama-bench failed ({exit_status(proc.returncode)}):\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout)
    out = []
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        samples = tuple(float(s) for s in r.get("samples_ts") or [r["avg_ts"]])
        fa = r.get("flash_attn", -1)
        out.append(LlamaBenchResult(test, r["n_prompt"], r["n_gen"], samples, str(r.get("build_commit", "")),
                                    int(fa) if isinstance(fa, (bool, int)) else -1, int(r.get("n_depth", depth))))
    return out


def best_rows(rows: list[LlamaBenchResult]) -> dict[str, LlamaBenchResult]:
    """The fastest row (median tok/s) per test kind, "pp" and "tg", over the flash-attention settings."""
    import statistics

    best: dict[str, LlamaBenchResult] = {}
    for r in rows:
        kind = r.test[:2]
        if kind not in best or statistics.median(r.tok_s_samples) > statistics.median(best[kind].tok_s_samples):
            best[kind] = r
    return best


def llama_server_command(build: LlamaCppBuild, gguf: Path, port: int, *, slots: int, ctx_per_slot: int,
                         threads: int, extra: list[str] | None = None) -> list[str]:
    """llama-server with one slot per stream and continuous batching; prompt caching off where the
    build has the switch (the load generator's unique prefixes defeat it in any case). `extra`
    (benchmarks/llamacpp_sweep.py's best setting) comes last and overrides threads and batching."""
    cmd = [str(build.binary("llama-server")), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(slots), "-c", str(slots * ctx_per_slot), "-t", str(threads),
           *(extra if extra is not None else ["--cont-batching"])]
    if _supports(build, "--no-cache-prompt"):
        cmd.append("--no-cache-prompt")
    return cmd


def _supports(build: LlamaCppBuild, flag: str) -> bool:
    proc = subprocess.run([str(build.binary("llama-server")), "--help"], capture_output=True, text=True)
    return flag in proc.stdout + proc.stderr


def requantize(build: LlamaCppBuild, src: Path, dst: Path, preset: str, pure: bool = False) -> Path:
    """Writes `src` requantized to a llama-quantize preset ("Q4_K_M", "Q6_K", ...) at `dst`, atomically.

    `--allow-requantize` lets an already quantized file be the source, as for the packaged SmolLM2 Q8_0;
    the result is what a user gets from the same preset (types per tensor chosen by llama.cpp).
    `pure` (`--pure`) writes every tensor in the preset's type (no Q8_0/Q6_K output or embedding).
    """
    if dst.is_file():
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    flags = ["--allow-requantize"] + (["--pure"] if pure else [])
    _run([str(build.binary("llama-quantize")), *flags, str(src), str(tmp), preset],
         dst.with_name(dst.name + ".log"))
    tmp.replace(dst)
    return dst


def pure_q4_0(build: LlamaCppBuild, src: Path) -> Path:
    """`src` requantized with `llama-quantize --pure` to Q4_0 (every tensor Q4_0: MAX's GGUF loader
    rejects the Q8_0 tensors of the plain preset), cached per source file."""
    from crucible.core.tokenizer import cache_dir, file_key

    pure = cache_dir() / "requant" / f"{src.stem}-{file_key(src)}-pure-Q4_0.gguf"
    pure.parent.mkdir(parents=True, exist_ok=True)
    return requantize(build, src, pure, "Q4_0", pure=True)


def build_dict(build: LlamaCppBuild) -> dict:
    """The build as a JSON-ready record."""
    d = asdict(build)
    d["bin_dir"] = str(build.bin_dir)
    return d
