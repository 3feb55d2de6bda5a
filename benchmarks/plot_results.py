"""Regenerates the charts of recorded runs from their JSON: `python -m benchmarks.plot_results [FOLDER ...]`.

benchmarks/results/ keeps the JSON and text of each run; the PNGs are derived (and ignored by git), so
the history does not grow by a picture per run. With no folder given, every run folder is redrawn.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.e2e import plot_e2e
from benchmarks.kernel_report import plot_kernels
from benchmarks.serve_compare import plot_serve

RESULTS = Path(__file__).resolve().parent / "results"
PLOTS = {"kernels.json": plot_kernels, "e2e.json": plot_e2e, "serve.json": plot_serve}


def plot_folder(folder: Path) -> list[Path]:
    """Draws a PNG beside each kernels.json, e2e.json and serve.json in the folder; returns them."""
    drawn = []
    for name, plot in PLOTS.items():
        src = folder / name
        if src.is_file():
            png = src.with_suffix(".png")
            plot(json.loads(src.read_text()), png)
            drawn.append(png)
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plot_results", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="run folders (default: every one in results/)")
    args = parser.parse_args(argv)
    folders = args.folders or sorted(p for p in RESULTS.iterdir() if p.is_dir())
    for folder in folders:
        for png in plot_folder(folder):
            print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
