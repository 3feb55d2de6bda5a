"""The output of ``crucible bench kernels``: the printed table, kernels.json and kernels.png."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from benchmarks.kernel_row import Row
from crucible.core.atomic_write import write_text_atomic


def write_report(rows: list[Row], extra: dict[str, float | str], targets: list[dict[str, object]], versions: dict,
                 out_dir: Path) -> Path:
    """Writes kernels.json and kernels.png under out_dir (created); returns the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "kernels.json"
    write_text_atomic(path, json.dumps({"versions": versions, "extra": extra, "targets": targets,
                                        "rows": [asdict(r) for r in rows]}, indent=1))
    plot_kernels({"rows": [asdict(r) for r in rows]}, out_dir / "kernels.png")
    return path


def plot_kernels(data: dict, png: Path) -> None:
    """The speed-up over MAX of every row of a kernels.json (as loaded) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if "max" in r["ratios"] or "max_fp32" in r["ratios"]]
    labels = [f"{r['op']} {r['model']} {r['variant']} " + ",".join(f"{k}={v}" for k, v in r["shape"].items())
              for r in rows]
    ratios = [r["ratios"].get("max", r["ratios"].get("max_fp32")) for r in rows]
    fig, ax = plt.subplots(figsize=(10, max(4, 0.18 * len(labels))))
    ax.barh(range(len(labels)), ratios, color=["tab:green" if v >= 1 else "tab:red" for v in ratios])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(range(len(labels)), labels, fontsize=5)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up over MAX's built-in (MAX time / Crucible time; >1 = Crucible faster)")
    fig.tight_layout()
    fig.savefig(png, dpi=130)
    plt.close(fig)


def format_table(rows: list[Row]) -> str:
    """A fixed-width table: one line per row, ours first, then each baseline."""
    lines = [f"{'op':<16}{'model':<14}{'variant':<18}{'shape':<34}{'system':<14}{'time us':>11}"
             f"{'GFLOP/s':>10}{'GB/s':>9}{'speed-up':>9}"]
    for r in rows:
        shape = ",".join(f"{k}={v}" for k, v in r.shape.items())
        for i, name in enumerate(r.times_us):
            # speed-up = baseline time / Crucible time: > 1 means Crucible is faster.
            ratio = "" if name == "crucible" else f"{r.ratios[name]:.2f}"
            # "!": read faster than the run's probe, so from a cache (Row.over_probe).
            flag = " !" if name in r.over_probe else ""
            head = (f"{r.op:<16}{r.model:<14}{r.variant:<18}{shape:<34}") if i == 0 else " " * 82
            lines.append(f"{head}{name:<14}{r.times_us[name]:>11.1f}{r.gflops[name]:>10.1f}{r.gbps[name]:>9.1f}{ratio:>9}{flag}")
    if any(r.over_probe for r in rows):
        lines.append("! read faster than the run's read-bandwidth probe: bytes from a cache, not DRAM")
    return "\n".join(lines)
