"""The README's performance tables, generated from committed e2e.json and serve.json records, so no
number in them is typed by hand (tests/test_readme_table.py checks the README against this output).

    python -m benchmarks.readme_table            # rewrite the table in README.md from README_RUNS
    python -m benchmarks.readme_table --check    # exit 1 if README.md differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- e2e-table:begin (python -m benchmarks.readme_table) -->", "<!-- e2e-table:end -->"
SERVE_BEGIN, SERVE_END = "<!-- serve-table:begin (python -m benchmarks.readme_table) -->", "<!-- serve-table:end -->"
SERVE_RUN = "cpu-2026-12-06c/serve-smollm2-q4_1"
# The runs the README shows, in order: one e2e.json each, under benchmarks/results/.
README_RUNS = (
    "cpu-2026-12-06b/e2e-smollm2-q4_1",
    "cpu-2026-12-06b/e2e-smollm2-Q4_0",
    "cpu-2026-12-06b/e2e-smollm2-Q8_0",
    "cpu-2026-12-06b/e2e-smollm2-Q4_K_M",
    "cpu-2026-12-06b/e2e-gemma3-270m",
)
COLUMNS = (("crucible", "Crucible"), ("crucible-q8", "Crucible, int8 act"), ("llama.cpp", "llama.cpp"),
           ("max", "MAX, float32 export"), ("max-q4_0", "MAX, Q4_0"))


def _model_name(model: str) -> str:
    return Path(model).name if "/" in model else model


def _cell(data: dict, system: str) -> str:
    s = data["summary"].get(system)
    failed = data["notes"].get(f"{system}_failed")
    if failed:
        return "FAILED: " + str(failed).splitlines()[0][:80].replace("|", "/")
    if s is None:
        return "-"
    cell = f"{s['prefill_tok_s']:.0f} / {s['decode_tok_s']:.1f}"
    if system not in ("crucible", "crucible-q8") and "crucible" in data["summary"] and s["decode_tok_s"] > 0:
        ours = data["summary"]["crucible"]
        cell += (f" (ours {ours['decode_tok_s'] / s['decode_tok_s']:.2f}x decode, "
                 f"worst rep {ours['decode_tok_s_min'] / s['decode_tok_s_max']:.2f}x)")
    return cell


def render(runs: tuple[str, ...] = README_RUNS, results: Path = ROOT / "benchmarks" / "results") -> str:
    """The markdown table (prefill / decode tok/s, batch 1, medians) of the given e2e runs."""
    header = "| model file (run) | " + " | ".join(title for _, title in COLUMNS) + " |"
    lines = [BEGIN, header, "|" + "---|" * (len(COLUMNS) + 1)]
    for run in runs:
        data = json.loads((results / run / "e2e.json").read_text())
        cfg = data["config"]
        lines.append(f"| {_model_name(cfg['model'])} (`{run}`, {cfg['reps']} reps) | "
                     + " | ".join(_cell(data, system) for system, _ in COLUMNS) + " |")
    lines.append(END)
    return "\n".join(lines)


def _serve_cell(data: dict, system: str, level: int) -> str:
    entry = data["systems"][system]
    if "summary" in data:  # medians over the reps
        r = data["summary"].get(system, {}).get(str(level))
        if entry.get("failed") and (r is None or not r["tok_s_max"]):
            return "FAILED: " + (entry.get("server_error") or entry["failed"])[:90].replace("|", "/")
        if r is None:
            return "-"
        ttft = "-" if r["ttft_p99_s"] is None else f"{r['ttft_p99_s']:.2f}"
        cell = f"{r['tok_s']:.1f} [{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}] ({ttft})"
        if r["errors"]:
            cell += f", {r['errors']} errors"
        if entry.get("failed"):  # it ran some reps, then failed
            cell += ", then FAILED: " + entry["failed"][:80].replace("|", "/")
        return cell
    r = next((r for r in entry["results"] if r["concurrency"] == level), None)
    return "-" if r is None else (f"{r['output_tok_per_s']:.1f} ({r['ttft_p99_s']:.2f})"
                                  + (f", {r['errors']} errors" if r["errors"] else ""))


def render_serve(run: str = SERVE_RUN, results: Path = ROOT / "benchmarks" / "results") -> str:
    """Output tok/s and p99 TTFT per system and concurrency of one serve.json."""
    data = json.loads((results / run / "serve.json").read_text())
    systems = data["systems"]
    levels = data["config"]["levels"]
    reps = data["config"].get("reps", 1)
    what = ("median output tok/s [min-max over the reps] (median p99 time to first token, s)" if "summary" in data
            else "output tok/s (p99 time to first token, s)")
    lines = [SERVE_BEGIN, f"`{run}`, {data['config']['model']}, {data['config']['max_tokens']} tokens per request, "
             f"{reps} rep{'s' if reps > 1 else ''}; {what}:", "",
             "| streams | " + " | ".join(systems) + " |", "|" + "---|" * (len(systems) + 1)]
    for level in levels:
        lines.append(f"| {level} | " + " | ".join(_serve_cell(data, name, level) for name in systems) + " |")
    flags = systems.get("llama.cpp", {}).get("flags_per_level")
    if flags:
        lines += ["", "llama-server flags per level (this host's sweep): "
                  + "; ".join(f"{lv}: `{f}`" for lv, f in flags.items())]
    verdicts = [t for t in data.get("targets", []) if "worst" in t or t.get("failed")]
    if "summary" in data and verdicts:
        lines += [""] + [f"- {'FAILED' if t.get('failed') else ('MET' if t['met'] else 'NOT MET')}: {t['target']}"
                         + (f" ({t['value']:.2f}x median, worst rep vs best {t['worst']:.2f}x{_interval(t)})"
                            if "worst" in t else "")
                         for t in verdicts]
    lines.append(SERVE_END)
    return "\n".join(lines)


def _interval(t: dict) -> str:
    """The paired bootstrap interval of a verdict, where it has one (benchmarks/paired.py)."""
    iv = t.get("interval")
    return "" if iv is None else f", paired interval [{iv[0]:.2f}, {iv[1]:.2f}] over {t['pairs']} reps"


def replace_in(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """README text with the block between the markers replaced by `table` (markers included)."""
    if begin not in text or end not in text:
        raise ValueError(f"README has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + table + tail


def rendered_readme(text: str) -> str:
    """The README with both tables regenerated."""
    return replace_in(replace_in(text, render()), render_serve(), SERVE_BEGIN, SERVE_END)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when README.md differs")
    args = p.parse_args(argv)
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = rendered_readme(text)
    if args.check:
        if new != text:
            print("README.md's e2e table is stale: run python -m benchmarks.readme_table", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
