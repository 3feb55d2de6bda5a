"""The standalone profiling drivers (benchmarks/profile_*.mojo) still build and run."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from crucible.core.proc import child_env, find_tool

REPO = Path(__file__).resolve().parents[2]


def _build(name: str, tmp_path: Path) -> Path:
    mojo = find_tool("mojo")
    assert mojo, "the mojo compiler is part of the test environment (modular==26.7.0)"
    exe = tmp_path / name
    # child_env: once an earlier test has imported MAX's pipelines, the `mojo` launcher needs the
    # environment without MAX's interpreter overrides (crucible/core/proc.py).
    build = subprocess.run([mojo, "build", "-I", str(REPO), "-O3", str(REPO / f"benchmarks/{name}.mojo"),
                            "-o", str(exe)], cwd=REPO, capture_output=True, text=True, env=child_env())
    assert build.returncode == 0, build.stderr[-4000:]
    return exe


def test_profile_attention_builds_and_times_a_decode_call_and_the_block_kernel(tmp_path: Path) -> None:
    exe = _build("profile_attention", tmp_path)
    # 9/3 heads over 300 keys (across a page boundary), 3 timed calls.
    run = subprocess.run([str(exe), "9", "3", "299", "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    m = re.search(r"Hq 9 Hkv 3 D 128 keys 300 : ([0-9.]+) us per call, ([0-9.]+) GB/s of K/V, ([0-9.]+) % of the"
                  r" read probe's best ([0-9.]+) GB/s", run.stdout)
    assert m, run.stdout
    us, gbps, pct, probe = (float(g) for g in m.groups())
    assert us > 0 and gbps > 0 and probe > 0
    assert abs(pct - 100 * gbps / probe) < 0.01 * pct + 1e-6, run.stdout
    for walk in ("cache-resident", "all keys in turn"):
        block = re.search(r"block kernel, one core, " + walk + r", Hq 9 Hkv 3 D 128 keys (\d+) in windows of (\d+)"
                          r" : ([0-9.e-]+) ns", run.stdout)
        assert block and float(block.group(3)) > 0, run.stdout
        keys, window = int(block.group(1)), int(block.group(2))
        # One window, or the 300 keys rounded up to whole windows (SLOT_KEYS: 16 with AVX2, 32 / 64 with AVX-512).
        assert keys == (window if walk == "cache-resident" else -(-300 // window) * window), run.stdout


def test_profile_qmatmul_builds_and_times_both_q4_formats(tmp_path: Path) -> None:
    exe = _build("profile_qmatmul", tmp_path)
    # 64 rows of K = 576 (9 block pairs: two-pair steps and a lone pair), 3 timings.
    run = subprocess.run([str(exe), "64", "576", "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    for qtype in ("q4_0", "q4_1"):
        row = re.search(qtype + r" row kernel, one core, cache-resident, N 64 K 576 : ([0-9.e-]+) ns per block",
                        run.stdout)
        assert row and float(row.group(1)) > 0, run.stdout
        for act in ("q8", "f32"):
            op = re.search(qtype + r" whole op, all cores, from DRAM, N 4096 K 576 copies \d+ : ([0-9.e-]+) us per op,"
                           r" [0-9.e-]+ GB/s of weights, act " + act, run.stdout)
            assert op and float(op.group(1)) > 0, run.stdout
    # K must cover whole block pairs; the driver says so instead of timing a partial row.
    bad = subprocess.run([str(exe), "64", "96", "3"], capture_output=True, text=True)
    assert bad.returncode != 0 and "multiple of 64" in (bad.stdout + bad.stderr)


def test_profile_gemm_builds_times_and_spot_checks_an_odd_shape(tmp_path: Path) -> None:
    exe = _build("profile_gemm", tmp_path)
    # M, K, N off every tile and chunk size (MR 6, FW 16 / 8, NR 64 / 16, KC, NC), 3 timed calls.
    run = subprocess.run([str(exe), "301", "1000", "777", "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    micro = re.search(r"micro-kernel, one core, cache-resident, MR \d+ NR \d+ KC \d+ : ([0-9.e-]+) GFLOP/s", run.stdout)
    op = re.search(r"whole op, all cores, M 301 K 1000 N 777 : best ([0-9.e-]+) us", run.stdout)
    assert micro and op, run.stdout
    assert float(micro.group(1)) > 0 and float(op.group(1)) > 0
    err = re.search(r"spot check, 64 entries: max abs error ([0-9.e-]+)", run.stdout)
    # fp32 products summed over K = 1000 values of size <= 0.25: a few 1e-5 at most.
    assert err and float(err.group(1)) < 1e-3, run.stdout
