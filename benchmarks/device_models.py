"""Whole models on the device: parity in float32 and bfloat16 against references computed here, and an
HTTP smoke test of `crucible serve` on that device.

The GPU machine has neither transformers nor the package index, so `prepare` (here) writes the models
and transformers' side of the parity check (benchmarks/model_parity.py's saved reference) into one
folder to carry; `run` (there) compares and serves:

    python -m benchmarks.device_models prepare build/device-models
    python3 -m benchmarks.device_models run build/device-models OUT --device gpu

The models: the tiny Llama (HF float32), the tiny Qwen2 (HF bf16 safetensors, tied head), the tiny
Gemma 3 (sliding windows, q/k norms) and the tiny Qwen2 as a GGUF holding every block type (K-quants,
Q5_0/Q5_1, BF16, Q8_0); about 15 MB in all. SmolLM2 (94 MB, more than one carry) is checked when it resolves on the device and
its reference was prepared (`--smollm2`). `run --device cpu` runs the float32 half here (tests).
Each (model, dtype) and the serve test is its own step: a failure is recorded and the rest go on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from benchmarks import model_parity as P

TOKENS = 12  # greedy tokens per prompt in the references
SERVE_PROMPT = "Say hello."


def prepare(folder: Path, smollm2: bool) -> dict:
    """Writes the tiny models and every reference into `folder` (needs transformers and torch)."""
    from tests.support.tiny_models import (EVERY_TYPE_OVERRIDES, TINY_GEMMA3, TINY_LLAMA, TINY_QWEN2, write_gguf,
                                           write_hf)

    folder.mkdir(parents=True, exist_ok=True)
    models = {
        "tiny-llama": write_hf(TINY_LLAMA, folder / "tiny-llama"),
        "tiny-qwen2-bf16": write_hf(TINY_QWEN2, folder / "tiny-qwen2-bf16", dtype="bfloat16"),
        "tiny-gemma3": write_hf(TINY_GEMMA3, folder / "tiny-gemma3"),
        "tiny-qwen2-every-type": write_gguf(TINY_QWEN2, folder / "tiny-qwen2-every-type.gguf", "Q8_0",
                                            overrides=EVERY_TYPE_OVERRIDES),
    }
    manifest = {"models": {}}
    for name, path in models.items():
        P.save_reference(P.reference_rows(str(path), TOKENS), folder / f"{name}.npz")
        manifest["models"][name] = path.name
    if smollm2:
        P.save_reference(P.reference_rows("smollm2-135m", TOKENS), folder / "smollm2-135m.npz")
        manifest["models"]["smollm2-135m"] = "smollm2-135m"  # a registry name: resolved on the device
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _model_ref(folder: Path, name: str, entry: str) -> str:
    path = folder / entry
    return str(path) if path.exists() else entry


def run(folder: Path, out: Path, device: str, dtypes: tuple[str, ...], bounds: dict[str, tuple[float, float]]) -> dict:
    """Parity of every prepared model in every dtype, then the serve smoke test; writes out/models.json."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    status: dict[str, dict] = {}

    def step(name: str, fn) -> None:
        start = time.perf_counter()
        try:
            result = fn()
            status[name] = {"ok": bool(result.get("passed", True)), "result": result}
        except Exception as exc:  # noqa: BLE001 - recorded; the other steps still run
            status[name] = {"ok": False, "error": repr(exc), "trace": traceback.format_exc()[-4000:]}
        status[name]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"[device_models] {name}: {'ok' if status[name]['ok'] else 'FAILED'} "
              f"({status[name]['seconds']} s){'' if status[name]['ok'] else ' ' + status[name].get('error', '')}",
              flush=True)
        (out / "models.json").write_text(json.dumps(status, indent=1, default=str))

    for name, entry in manifest["models"].items():
        model = _model_ref(folder, name, entry)
        if not _resolves(model):  # e.g. SmolLM2's GGUF was not carried this time
            status[f"parity {name}"] = {"ok": True, "skipped": f"{model} is not on this machine", "seconds": 0.0}
            print(f"[device_models] parity {name}: skipped ({model} is not on this machine)", flush=True)
            continue
        rows = P.load_reference(folder / f"{name}.npz")
        for dtype in dtypes:
            bound, top1 = bounds[dtype]
            step(f"parity {name} {dtype}", lambda m=model, d=dtype, b=bound, t=top1: _parity(m, rows, device, d, b, t))
    first = next(iter(manifest["models"]))
    step(f"serve {first}", lambda: serve_smoke(_model_ref(folder, first, manifest["models"][first]), device))
    return status


def _resolves(model: str) -> bool:
    from crucible.core.registry import resolve_model

    try:
        resolve_model(model)
    except Exception:  # noqa: BLE001 - any failure to find it means "not carried"
        return False
    return True


def _parity(model: str, rows: list[P.RefRow], device: str, dtype: str, bound: float, top1: float) -> dict:
    record = P.run(model, rows, device, dtype, bound, top1)
    return {"passed": record["passed"], "bound": bound, "top1_fraction": top1,
            "provenance": {k: record["provenance"][k] for k in ("dtype", "device", "hot_path_fallbacks", "ops")},
            "rows": [{k: r[k] for k in ("positions", "ratio", "top1_agreement", "greedy_identical")}
                     for r in record["rows"]]}


def serve_smoke(model: str, device: str) -> dict:
    """`crucible serve` on the device: one chat completion and one streamed, through plain HTTP."""
    import httpx

    from serve.launch import start_server, stop_server

    server = start_server(model, "--devices", device, timeout_s=600)
    try:
        served = httpx.get(server.v1 + "/models", timeout=30).json()["data"][0]["id"]
        body = {"model": served, "messages": [{"role": "user", "content": SERVE_PROMPT}], "max_tokens": 8,
                "temperature": 0}
        r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=120)
        r.raise_for_status()
        answer = r.json()
        chunks = []
        with httpx.stream("POST", server.v1 + "/chat/completions", json={**body, "stream": True}, timeout=120) as s:
            for line in s.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
        text = answer["choices"][0]["message"]["content"]
        return {"passed": streamed == text and answer["usage"]["completion_tokens"] > 0, "text": text,
                "streamed_text": streamed, "usage": answer["usage"],
                "kernels": r.headers.get("x-crucible-kernels", "")}
    finally:
        stop_server(server)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pp = sub.add_parser("prepare", help="write the models and references (here, with transformers)")
    pp.add_argument("folder", type=Path)
    pp.add_argument("--smollm2", action="store_true", help="also SmolLM2's reference (its GGUF is carried apart)")
    pr = sub.add_parser("run", help="compare and serve on the device")
    pr.add_argument("folder", type=Path)
    pr.add_argument("out", type=Path)
    pr.add_argument("--device", choices=["cpu", "gpu"], default="gpu")
    pr.add_argument("--bf16-bound", type=float, default=5e-2)
    pr.add_argument("--bf16-top1", type=float, default=0.9)
    args = p.parse_args(argv)
    if args.command == "prepare":
        manifest = prepare(args.folder, args.smollm2)
        print(f"prepared {', '.join(manifest['models'])} in {args.folder}")
        return 0
    dtypes = ("float32", "bfloat16") if args.device == "gpu" else ("float32",)
    bounds = {"float32": (1e-4, 1.0), "bfloat16": (args.bf16_bound, args.bf16_top1)}
    status = run(args.folder, args.out, args.device, dtypes, bounds)
    return 0 if all(s["ok"] for s in status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
