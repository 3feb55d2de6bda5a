"""The kernel issue's speed targets, judged on the rows of one ``crucible bench kernels`` run.

Bandwidth targets are judged against the best read rate of the whole run (_ceiling). The chain
rows' targets also state what is attainable at all: with the per-op cost every parallel op pays
(_attainable) and with the weights in cache (_in_cache_bound).

Each target's value is the ratio of medians; it is MET only when its "worst" holds the need too: our
slowest interleaved round against the baseline's fastest (Row.slowest_us / fastest_us), so a ratio
inside the noise is not a win.
"""

from __future__ import annotations

from benchmarks.kernel_row import Row


def _act(variant: str) -> str:
    """Activation variant of a qmatmul row: "target:q4_1:q8" -> "q8", "target:q4_1" -> "f32"."""
    parts = variant.split(":")
    return parts[2] if len(parts) > 2 else "f32"


def _ceiling(row: Row, run_ceiling_gbps: float) -> float:
    """The read-bandwidth ceiling a row is judged against: the best read rate of the whole run.

    The probe of this shared machine is bimodal (~42 or ~72 GB/s, changing within a process), and the
    fp32 matmuls have streamed 72 GB/s while a probe interleaved with them read 45. A row's own
    interleaved ceiling (row.ceiling_gbps, kept in the JSON) can therefore be low by chance; the
    run's best is what the machine demonstrably delivered, the strictest fair ceiling.
    """
    return max(row.ceiling_gbps, run_ceiling_gbps)


def _attainable(nbytes: float, ceiling_gbps: float, extra: dict[str, float | str]) -> float:
    """The fraction of read bandwidth a parallel op moving nbytes could reach at best: its bytes at
    the ceiling plus the fixed cost every parallel op pays here (dispatch + hand-off, measured by
    KernelBench.op_overhead). Small decode ops are bounded by it whatever their kernel does."""
    stream_us = nbytes / ceiling_gbps / 1e3
    return stream_us / (stream_us + float(extra["op_dispatch_us"]) + float(extra["parallel_handoff_us"]))


def _in_cache_bound(rows: list[Row], chain: Row, ceiling_gbps: float) -> float | None:
    """The fraction of read bandwidth a quantized chain row could reach with all reads hidden: its
    bytes at the speed of its "cached:" companion (chain_rows), over the ceiling. None without one
    (older JSON)."""
    for r in rows:
        if (r.op == chain.op and r.variant == "cached:" + chain.variant.split(":", 1)[1]
                and (r.shape["K"], r.shape["N"]) == (chain.shape["K"], chain.shape["N"])):
            return r.gbps["crucible"] / ceiling_gbps
    return None


def _speedup(base: Row, base_system: str, ours: Row) -> tuple[float, float]:
    """(median ratio, worst ratio) of base_system's time in row base over crucible's in row ours."""
    return (base.times_us[base_system] / ours.times_us["crucible"],
            base.fastest_us(base_system) / ours.slowest_us("crucible"))


def _share(row: Row, ceiling: float) -> tuple[float, float]:
    """(median, worst) of crucible's read rate in row as a share of the ceiling."""
    return row.gbps["crucible"] / ceiling, row.bytes / row.slowest_us("crucible") / 1e3 / ceiling


def _t(name: str, values: tuple[float, float], need: float, **more: object) -> dict[str, object]:
    return {"target": name, "value": values[0], "worst": values[1], "need": need, **more}


def check_targets(rows: list[Row], extra: dict[str, float | str], target: str) -> list[dict[str, object]]:
    """The kernel issues' speed targets, each with the measured value and met / not met."""
    if target == "gpu":
        return _met(gpu_targets(rows, extra))
    if target != "cpu":
        return []

    def find(op, shape, variant_prefix="target"):
        for r in rows:
            if r.op == op and r.shape == shape and r.variant.startswith(variant_prefix):
                yield r

    out = []
    bw = max(extra["read_bandwidth_gbps"], extra.get("read_ceiling_gbps", 0.0))
    for r in find("matmul", {"M": 512, "K": 1536, "N": 1536}):
        out.append(_t("fp32 matmul M=512 K=N=1536 >= 0.9x MAX", _speedup(r, "max", r), 0.9))
    for shape in ({"M": 1, "K": 576, "N": 1536}, {"M": 1, "K": 4096, "N": 4096}):
        for r in find("matmul", shape):
            out.append(_t(f"fp32 matmul M=1 K={shape['K']} N={shape['N']} >= 2x MAX", _speedup(r, "max", r), 2.0))
    for r in rows:
        if r.op == "qmatmul" and r.variant.startswith("target") and r.variant.split(":")[1] in ("q4_0", "q4_1"):
            q, act, s = r.variant.split(":")[1], _act(r.variant), r.shape
            ceiling = _ceiling(r, bw)
            out.append(_t(f"{q} act={act} M=1 K={s['K']} N={s['N']} >= 60% of read bandwidth", _share(r, ceiling),
                          0.6, ceiling_gbps=ceiling))
            out.append(_t(f"{q} act={act} M=1 K={s['K']} N={s['N']} >= 3x our fp32 matmul",
                          _speedup(r, "crucible_fp32", r), 3.0))
    # The decode shapes as a model runs them (chain_rows): per-op time with the weights read from
    # DRAM and without a per-execute overhead each.
    for chain_fp32 in (r for r in rows if r.op == "matmul" and r.variant == "chain"):
        kk, nn = chain_fp32.shape["K"], chain_fp32.shape["N"]
        out.append(_t(f"fp32 matmul M=1 K={kk} N={nn} >= 2x MAX (chain of copies)",
                      _speedup(chain_fp32, "max", chain_fp32), 2.0))
        for r in rows:
            if (r.op == "qmatmul" and r.variant.startswith("chain:")
                    and (r.shape["K"], r.shape["N"]) == (kk, nn)):
                q, act = r.variant.split(":")[1], _act(r.variant)
                ceiling = _ceiling(r, bw)
                t = _t(f"{q} act={act} M=1 K={kk} N={nn} >= 60% of read bandwidth (chain of copies)",
                       _share(r, ceiling), 0.6, ceiling_gbps=ceiling)
                if "op_dispatch_us" in extra:
                    t["attainable"] = _attainable(r.bytes, ceiling, extra)
                in_cache = _in_cache_bound(rows, r, ceiling)
                if in_cache is not None:
                    t["in_cache"] = in_cache
                out.append(t)
                out.append(_t(f"{q} act={act} M=1 K={kk} N={nn} >= 3x our fp32 matmul (chain of copies)",
                              _speedup(chain_fp32, "crucible", r), 3.0))
    for r in rows:
        if r.op == "attention_paged" and r.shape.get("cached") == 4096 and r.shape["Hq"] == 32:
            ceiling = _ceiling(r, bw)
            out.append(_t("decode attention 4096 cached, 32/8 heads, D=128 >= 50% of read bandwidth",
                          _share(r, ceiling), 0.5, ceiling_gbps=ceiling))
            break
    return _met(out)


def _met(out: list[dict[str, object]]) -> list[dict[str, object]]:
    for t in out:
        t["met"] = bool(min(t["value"], t["worst"]) >= t["need"])
    return out


def _bf16(row: Row) -> bool:
    """A bf16 row: the benchmark writes str(DType.bfloat16), "DType.bfloat16"."""
    return row.dtype.removeprefix("DType.") == "bfloat16"


def gpu_targets(rows: list[Row], extra: dict[str, float | str]) -> list[dict[str, object]]:
    """The GPU issue's kernel targets (item 4), on the chain rows of KernelBench.gpu_chain_rows and
    the decode attention row; bandwidth shares are against the run's best 16-byte-vector probe."""
    out = []
    bw = max(extra.get("read_bandwidth_gbps", 0.0), extra.get("read_ceiling_gbps", 0.0))
    mm = {r.shape["M"]: r for r in rows if r.op == "matmul" and r.variant == "chain" and _bf16(r)}
    for m, r in sorted(mm.items()):
        k, n = r.shape["K"], r.shape["N"]
        what, need = (("GEMV", 0.9) if m == 1 else ("batched decode", 0.8) if m <= 64 else ("GEMM", 0.7))
        out.append(_t(f"bf16 {what} M={m} K={k} N={n} >= {need}x MAX (chain)", _speedup(r, "max", r), need))
    gemv = mm.get(1)
    for r in rows:
        if r.op == "qmatmul" and r.variant.startswith("chain:") and _bf16(r):
            _, q, variant = r.variant.split(":")
            ceiling = _ceiling(r, bw)
            out.append(_t(f"{q} [{variant}] M=1 K={r.shape['K']} N={r.shape['N']} >= 60% of read bandwidth (chain)",
                          _share(r, ceiling), 0.6, ceiling_gbps=ceiling))
            if gemv is not None:
                out.append(_t(f"{q} [{variant}] M=1 >= 2.5x our bf16 GEMV (chain)",
                              _speedup(gemv, "crucible", r), 2.5))
    for r in rows:
        if r.op == "attention_paged" and r.shape.get("cached") == 4096 and r.shape.get("Hq") == 32:
            ceiling = _ceiling(r, bw)
            out.append(_t("paged decode attention 4096 cached, 32/8 heads, D=128 >= 60% of read bandwidth",
                          _share(r, ceiling), 0.6, ceiling_gbps=ceiling))
            break
    return out
