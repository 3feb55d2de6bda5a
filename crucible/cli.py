"""The ``crucible`` command line: one entry point, one subcommand per job.

Subcommand handlers import their heavy dependencies (MAX, torch) lazily so that ``crucible models`` and
``crucible --help`` answer at once. Failures print one line (crucible/core/errors.py): status 2 for a user
error (a bad flag value, a missing or unsupported model, no GPU), 1 for anything else.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from crucible import __version__
from crucible.core.devices import DTYPES, NO_GPU, gpu_count
from crucible.core.errors import USER_ERROR, report
from crucible.core.registry import DEFAULT_MODEL, list_models
from pipelines.scheduler import DEFAULT_CPU_BATCH


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")


def cmd_models(args: argparse.Namespace) -> int:
    """Prints what each named model holds, or the registry's models, where each is installed and its size."""
    from crucible.core.registry import resolve_model
    from graphs.inventory import inventory

    if args.models:  # one line each, from the file headers: architecture, parameters, tensor types, bytes
        for name in args.models:
            print(inventory(resolve_model(name)).line())
        return 0
    for row in list_models():
        print(f"{row.name}  {row.description}")
        if row.path is None:
            print(f"    not installed; install with: {row.install}")
        else:
            print(f"    path: {row.path}")
            print(f"    size: {_human_size(row.size_bytes or 0)} ({row.size_bytes} bytes)")
    print("Any other model is a local path: a .gguf file or a Hugging Face folder "
          "(config.json, *.safetensors, tokenizer files).")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """Answers one chat message (or continues raw text) greedily on our kernels and prints timing."""
    import time

    from crucible.core.registry import resolve_model
    from crucible.core.tokenizer import encode_prompt, load_tokenizer
    from graphs.generate import greedy_generate
    from graphs.model import CrucibleModel, ModelOptions

    source = resolve_model(args.model)
    model = CrucibleModel(source, ModelOptions(device=args.device, activations=args.activations, dtype=args.dtype))
    tokenizer = load_tokenizer(source)
    print(f"[crucible] {model.load_line()}; kernels {model.provenance['kernel_build']}, hot-path fallbacks: "
          f"{model.provenance['hot_path_fallbacks'] or 'none'}", file=sys.stderr)
    ids = encode_prompt(tokenizer, args.prompt, chat=not args.raw)
    start = time.perf_counter()
    out = greedy_generate(model, [ids], args.max_tokens, stop_ids=model.config.eos_token_ids)[0]
    elapsed = time.perf_counter() - start
    print(tokenizer.decode(out, skip_special_tokens=True))
    print(f"[crucible] {len(ids)} prompt tokens, {len(out)} generated in {elapsed:.2f}s "
          f"({len(out) / elapsed:.1f} tok/s end to end, greedy)", file=sys.stderr)
    return 0


def cmd_batch(args: argparse.Namespace) -> int:
    """Offline batch generation over a JSONL file (resumable; see pipelines/batch.py)."""
    from pathlib import Path

    from pipelines.batch import run_batch
    from pipelines.generator import Generator

    in_path, out_path = Path(args.input), Path(args.output)
    if not in_path.is_file():
        raise FileNotFoundError(f"input file {in_path} does not exist")
    settings = {"device": args.device, "max_batch_size": args.max_batch_size, "activations": args.activations,
                "dtype": args.dtype}
    _ray_sizes(args, args.device == "gpu")  # refuses replica sizes without --ray
    if args.ray is not None:
        s = _ray_batch(args, in_path, out_path, settings)
    else:
        gen = Generator(args.model, **settings)
        print(f"[crucible] {gen.engine.model.load_line()}", file=sys.stderr)
        s = run_batch(gen, in_path, out_path, raw=args.raw)
    print(f"[batch] {s.completed} rows generated, {s.errors} errors, {s.skipped} already done; "
          f"{s.completion_tokens} tokens in {s.seconds:.1f}s "
          f"({s.completion_tokens / max(s.seconds, 1e-9):.1f} output tok/s) -> {out_path}", file=sys.stderr)
    # 1 when any row failed: its record in the output says why; the other rows were generated.
    return 1 if s.errors else 0


def _ray_batch(args: argparse.Namespace, in_path, out_path, settings: dict):
    """The batch on a Ray actor pool (pipelines/ray_batch.py); Ray is imported only here."""
    address, replicas, cpus, gpus = _ray_plan(args, args.device == "gpu", "data", "Ray Data")
    from pipelines.ray_batch import RayBatchConfig, run_ray_batch

    cfg = RayBatchConfig(address=address, replicas=replicas, cpus_per_replica=cpus, gpus_per_replica=gpus)
    return run_ray_batch(args.model, in_path, out_path, cfg, settings, raw=args.raw)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serves the model over an OpenAI-compatible HTTP API."""
    from crucible.core.registry import resolve_model
    from serve.app import ServerConfig
    from serve.server import run_server

    resolve_model(args.model)  # a missing file or unknown name fails here, before the server starts
    _ray_sizes(args, args.devices == "gpu")  # refuses replica sizes without --ray
    config = ServerConfig(model=args.model, served_name=args.served_model_name, device=args.devices,
                          activations=args.activations, dtype=args.dtype,
                          max_batch_size=args.max_batch_size, max_in_flight=args.max_queue,
                          max_body_bytes=args.max_body_bytes, api_key=args.api_key, kv_cache_gib=args.kv_cache_gib,
                          prefix_caching=args.prefix_caching)
    if args.ray is not None:
        return _ray_serve(args, config)
    print(f"[crucible] serving {args.model} on http://{args.host}:{args.port} (loading; GET /health)", file=sys.stderr)
    return run_server(config, host=args.host, port=args.port)


def _ray_serve(args: argparse.Namespace, config) -> int:
    """The server as replicas behind Ray Serve (serve/ray_serve.py); Ray is imported only here."""
    address, replicas, cpus, gpus = _ray_plan(args, args.devices == "gpu", "serve", "Ray Serve")
    from serve.ray_serve import RayServeConfig, run_ray_server
    from serve.server import with_api_key

    cfg = RayServeConfig(address=address, replicas=replicas, cpus_per_replica=cpus, gpus_per_replica=gpus)
    print(f"[crucible] http://{args.host}:{args.port} once every replica has loaded", file=sys.stderr)
    return run_ray_server(with_api_key(config, args.host), cfg, args.host, args.port)


def _ray_plan(args: argparse.Namespace, gpu: bool, extra: str, what: str) -> tuple[str | None, int, float, float]:
    """Checks that Ray (with `extra`) is installed, says on stderr where the replicas go, returns --ray's
    address and the replica sizes (as _ray_sizes)."""
    try:
        import importlib

        importlib.import_module("ray." + extra)
    except ImportError:
        raise ValueError(f"--ray needs Ray: pip install '.[ray]' (or pip install 'ray[{extra}]')") from None
    address, replicas, cpus, gpus = _ray_sizes(args, gpu)
    gpu_part = f" and {gpus:g} GPUs" if gpus else ""
    print(f"[crucible] {what}: {replicas} replicas of {args.model}, {cpus:g} CPUs{gpu_part} each, on "
          f"{address or 'a local cluster'}", file=sys.stderr)
    return address, replicas, cpus, gpus


def cmd_bench_serve(args: argparse.Namespace) -> int:
    """Load-tests servers: a running one (--url), or each of --systems spawned in turn on one model."""
    from pathlib import Path

    from crucible.core.versions import version_matrix

    levels = [int(c) for c in args.levels.split(",")]
    out_dir = Path(args.out)
    if args.url is not None:
        from benchmarks.serve_load import format_results, run_load, write_json

        results = run_load(args.url, args.served_name or args.model, levels, args.max_requests, args.max_seconds,
                           args.max_tokens, args.api_key)
        print(format_results(args.system, results))
        out = out_dir / "serve.json"
        write_json(out, args.system, results, {"url": args.url, "model": args.model,
                                               "versions": version_matrix("cpu"), "max_tokens": args.max_tokens})
        print(f"wrote {out}")
        return 0

    from benchmarks.serve_compare import (ServeCompareConfig, check_serve_targets, format_compare, run_compare,
                                          write_compare)
    from crucible.core.registry import resolve_model

    systems = tuple(args.systems.split(","))
    if not args.build_llama_cpp and ("llama.cpp" in systems or "max-q4_0" in systems):
        from benchmarks.llamacpp import is_built

        if not is_built():
            # max-q4_0's file is made by llama.cpp's llama-quantize.
            print("llama.cpp: NOT BUILT, llama.cpp and max-q4_0 skipped; rerun with --build-llama-cpp "
                  "(~15 min on 2 cores)", flush=True)
            systems = tuple(s for s in systems if s not in ("llama.cpp", "max-q4_0"))
    cfg = ServeCompareConfig(model=args.model, systems=systems, levels=tuple(levels),
                             max_requests=args.max_requests, max_seconds=args.max_seconds,
                             max_tokens=args.max_tokens, build_llama_cpp=args.build_llama_cpp, reps=args.reps)
    source = resolve_model(cfg.model)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, info = run_compare(cfg, source, out_dir, log=lambda msg: print(msg, flush=True))
    targets = check_serve_targets(results, info)
    print(format_compare(results, targets))
    path = write_compare(results, info, targets, version_matrix("cpu"), cfg, out_dir)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def cmd_bench_kernels(args: argparse.Namespace) -> int:
    """Runs the kernel benchmark, prints the table and the speed targets, writes JSON and a PNG."""
    from pathlib import Path

    # numpy's OpenBLAS workers spin after every call and steal the cores from the next system timed
    # (benchmarks/timing.py); a short spin keeps the interleaved comparison fair. Read at numpy load.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

    from benchmarks.kernel_report import format_table, write_report
    from benchmarks.kernel_targets import check_targets
    from benchmarks.kernels import KernelBench
    from crucible.core.versions import version_matrix

    if args.jobs > 1:
        from benchmarks.bench_precompile import precompile_bench

        # Graphs compile side by side first (one process compiles one at a time); the run loads them.
        precompile_bench(args.target, args.quick, args.jobs, log=lambda msg: print(msg, flush=True))
    bench = KernelBench(args.target, quick=args.quick)
    rows = bench.run(log=lambda msg: print(msg, flush=True))
    print(format_table(rows))
    targets = check_targets(rows, bench.extra, args.target)
    for t in targets:
        ceiling = f", read ceiling {t['ceiling_gbps']:.1f} GB/s" if "ceiling_gbps" in t else ""
        if "attainable" in t:
            ceiling += f"; at most {t['attainable']:.2f} with the measured per-op cost"
        if "in_cache" in t:
            ceiling += f"; {t['in_cache']:.2f} with the weights in cache"
        print(f"{'MET    ' if t['met'] else 'NOT MET'}  {t['target']}: {t['value']:.2f}, worst round vs best "
              f"{t['worst']:.2f} (need {t['need']}{ceiling})")
    for reason in bench.skipped:
        print(f"SKIPPED  {reason}")
    path = write_report(rows, bench.extra, targets, version_matrix(args.target), Path(args.out))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def cmd_bench_e2e(args: argparse.Namespace) -> int:
    """Batch-1 prefill/decode on crucible, MAX's built-in pipeline and llama.cpp, interleaved."""
    from pathlib import Path

    from benchmarks.e2e import E2EConfig, check_targets, format_report, run_e2e, write_report
    from crucible.core.versions import version_matrix

    cfg = E2EConfig(model=args.model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                    reps=args.reps, systems=tuple(args.systems.split(",")), build_llama_cpp=args.build_llama_cpp,
                    tune_threads=not args.no_thread_tuning)
    report = run_e2e(cfg, log=lambda msg: print(msg, flush=True))
    targets = check_targets(report.summary(), report.samples)
    print(format_report(report, targets))
    path = write_report(report, targets, version_matrix("cpu"), Path(args.out))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0


def cmd_bench_threads(args: argparse.Namespace) -> int:
    """Batch-1 decode with and without the CPU thread priorities, in alternating child processes."""
    import json
    from pathlib import Path

    from benchmarks.thread_tuning import ThreadBenchConfig, format_summary, run_thread_bench
    from crucible.core.atomic_write import write_text_atomic
    from crucible.core.versions import version_matrix

    cfg = ThreadBenchConfig(model=args.model, context=args.context, steps=args.steps, sessions=args.sessions,
                            rounds=args.rounds)
    summary = run_thread_bench(cfg, log=lambda msg: print(msg, flush=True))
    print(format_summary(cfg, summary))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "threads.json"
    write_text_atomic(path, json.dumps({"config": cfg.__dict__, "summary": summary,
                                        "versions": version_matrix("cpu")}, indent=1))
    print(f"wrote {path}")
    return 0


def cmd_bench_api(args: argparse.Namespace) -> int:
    """Cost of structured output and penalties per decode step, and time to first token with prefix caching."""
    import json
    from pathlib import Path

    from benchmarks.api_features import ApiBenchConfig, format_summary, run_api_bench
    from crucible.core.atomic_write import write_text_atomic
    from crucible.core.versions import version_matrix

    cfg = ApiBenchConfig(model=args.model, steps=args.steps, rounds=args.rounds,
                         streams=tuple(int(s) for s in args.streams.split(",")))
    result = run_api_bench(cfg, log=lambda msg: print(msg, flush=True))
    print(format_summary(cfg, result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "api.json"
    write_text_atomic(path, json.dumps({"config": {**cfg.__dict__, "streams": list(cfg.streams)}, "result": result,
                                        "versions": version_matrix("cpu")}, indent=1, default=str))
    print(f"wrote {path}")
    return 0


def cmd_qualify(args: argparse.Namespace) -> int:
    """Writes a qualification record (JSON + Markdown) for a model on a target."""
    from pathlib import Path

    from crucible.qualify import QualifyConfig, qualify, write_record

    reference = Path(args.reference) if args.reference else None
    if reference is not None and not reference.is_file():
        raise FileNotFoundError(f"reference file {reference} does not exist "
                                "(python -m benchmarks.model_parity MODEL --save-reference FILE writes one)")
    cfg = QualifyConfig(model=args.model, target=args.target, conformance=not args.no_conformance,
                        e2e_reps=args.reps, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                        dtype=args.dtype, reference=reference)
    record = qualify(cfg, log=lambda msg: print(msg, flush=True))
    path = write_record(record, Path(args.out))
    print(path.with_suffix(".md").read_text())
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0 if record["qualified"] else 1


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (status 2) instead of the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _bounded_int(lo: int, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer: {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"{value} is out of range ({lo}..{hi if hi is not None else ''})")
        return value

    return parse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number >= 0")
    return value


POSITIVE = _bounded_int(1)
PORT = _bounded_int(1, 65535)


def _ray_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help=f"{what}: a local cluster, or the one at ADDRESS ('auto', 'ray://host:10001')")
    p.add_argument("--replicas", type=POSITIVE, default=None, help="with --ray: replicas, each holding one model "
                                                                    "(default 1)")
    p.add_argument("--cpus-per-replica", type=_positive_float, default=None,
                   help="with --ray: CPUs per replica (default 1)")
    p.add_argument("--gpus-per-replica", type=_non_negative_float, default=None,
                   help="with --ray: GPUs per replica (default 1 on a GPU, else 0)")


def _ray_sizes(args: argparse.Namespace, gpu: bool) -> tuple[str | None, int, float, float]:
    """--ray's address (None: a local cluster) and the replica sizes; the sizes without --ray are an error."""
    sizes = (args.replicas, args.cpus_per_replica, args.gpus_per_replica)
    if args.ray is None:
        named = [f for f, v in zip(("--replicas", "--cpus-per-replica", "--gpus-per-replica"), sizes) if v is not None]
        if named:
            raise ValueError(f"{', '.join(named)} needs --ray")
    gpus = args.gpus_per_replica if args.gpus_per_replica is not None else (1.0 if gpu else 0.0)
    return (None if args.ray in (None, "local") else args.ray, args.replicas or 1, args.cpus_per_replica or 1.0,
            gpus)


def build_parser() -> argparse.ArgumentParser:
    """Builds the argument parser with every subcommand."""
    parser = _Parser(prog="crucible", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"crucible {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("models", help="list the models Crucible can load by name, or what MODEL files hold")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="registry names or paths: print architecture, parameters, tensors per type, bytes")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("generate", help="answer one prompt on the embedded model (or --model) with our kernels")
    p.add_argument("prompt", nargs="?", default="What is the capital of France?")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name, .gguf file or HF folder")
    p.add_argument("--max-tokens", type=POSITIVE, default=64)
    p.add_argument("--raw", action="store_true", help="continue the text as is (no chat template)")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--activations", choices=["f32", "q8"], default="f32",
                   help="q8: int8 activations in the CPU decode matmuls (as llama.cpp; faster, ~1e-2 logit error)")
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="compute dtype: auto = float32 on CPU, bfloat16 on GPU (bf16 weights, activations and KV "
                        "cache; GGUF blocks stay blocks); bfloat16 needs a GPU")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (default: embedded SmolLM2 on 127.0.0.1:8000)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name, .gguf file or HF folder")
    p.add_argument("--served-model-name", default=None, help="model id clients use (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback unless told otherwise)")
    p.add_argument("--port", type=PORT, default=8000)
    p.add_argument("--devices", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--max-batch-size", type=POSITIVE, default=DEFAULT_CPU_BATCH, help="requests decoded together")
    p.add_argument("--max-queue", type=POSITIVE, default=256, help="requests admitted at once; more get 429")
    p.add_argument("--max-body-bytes", type=POSITIVE, default=1 << 20, help="larger request bodies get 413")
    p.add_argument("--kv-cache-gib", type=_positive_float, default=1.0, help="memory for the paged KV cache")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer <key> (or $CRUCIBLE_API_KEY)")
    p.add_argument("--no-prefix-caching", dest="prefix_caching", action="store_false",
                   help="compute every prompt in full (default: reuse the KV pages of cached prompt prefixes)")
    p.add_argument("--activations", choices=["f32", "q8"], default="f32",
                   help="q8: int8 activations in the CPU decode matmuls (as llama.cpp; faster, ~1e-2 logit error)")
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="compute dtype: auto = float32 on CPU, bfloat16 on GPU (bf16 weights, activations and KV "
                        "cache; GGUF blocks stay blocks); bfloat16 needs a GPU")
    _ray_flags(p, "serve replicas behind Ray Serve's proxy")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("batch", help="offline batch generation: JSONL prompts in, JSONL results out")
    p.add_argument("input", help="JSONL: {\"prompt\": ...} or {\"messages\": [...]} per line, optional id")
    p.add_argument("output", help="JSONL results; rerunning skips rows already there")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--max-batch-size", type=POSITIVE, default=DEFAULT_CPU_BATCH)
    p.add_argument("--raw", action="store_true", help="prompts are raw text to continue (no chat template)")
    p.add_argument("--activations", choices=["f32", "q8"], default="f32",
                   help="q8: int8 activations in the CPU decode matmuls (as llama.cpp; faster, ~1e-2 logit error)")
    p.add_argument("--dtype", choices=list(DTYPES), default="auto",
                   help="compute dtype: auto = float32 on CPU, bfloat16 on GPU (bf16 weights, activations and KV "
                        "cache; GGUF blocks stay blocks); bfloat16 needs a GPU")
    _ray_flags(p, "run on Ray Data")
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser("qualify", help="qualification record of a model on a target (JSON + Markdown)")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--target", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--no-conformance", action="store_true", help="skip the op grid (the record says so)")
    p.add_argument("--reps", type=POSITIVE, default=3, help="throughput repetitions")
    p.add_argument("--prompt-tokens", type=POSITIVE, default=512)
    p.add_argument("--gen-tokens", type=POSITIVE, default=128)
    p.add_argument("--dtype", choices=list(DTYPES), default="auto", help="auto = float32 on CPU, bfloat16 on GPU")
    p.add_argument("--reference", default=None,
                   help="saved transformers reference for parity (benchmarks/model_parity.py --save-reference); "
                        "needed where transformers does not run, e.g. a GPU machine")
    p.add_argument("--out", default="qualify-out")
    p.set_defaults(func=cmd_qualify)
    bench = sub.add_parser("bench", help="benchmarks: kernels, e2e, serve")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, parser_class=_Parser)
    p = bench_sub.add_parser("kernels", help="every kernel at SmolLM2 and Llama-3-8B shapes vs MAX and numpy")
    p.add_argument("--target", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--out", default="bench-out", help="folder for kernels.json and kernels.png")
    p.add_argument("--quick", action="store_true", help="SmolLM2 shapes and the speed-target rows only")
    p.add_argument("--jobs", type=POSITIVE, default=os.cpu_count() or 1,
                   help="processes compiling the graphs before the run (default: one per CPU; 1: compile as rows go)")
    p.set_defaults(func=cmd_bench_kernels)
    p = bench_sub.add_parser("e2e", help="batch-1 prefill/decode: crucible vs MAX's pipeline vs llama.cpp")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name or GGUF file")
    p.add_argument("--systems", default="crucible,crucible-q8,max,max-q4_0,llama.cpp")
    p.add_argument("--prompt-tokens", type=POSITIVE, default=512)
    p.add_argument("--gen-tokens", type=POSITIVE, default=128)
    p.add_argument("--reps", type=POSITIVE, default=3)
    p.add_argument("--build-llama-cpp", action="store_true",
                   help="build llama.cpp from the llama-cpp-python sdist if not cached (~15 min on 2 cores)")
    p.add_argument("--no-thread-tuning", action="store_true",
                   help="leave MAX's CPU runtime threads at their default priorities (the baseline of graphs/cpu_threads.py)")
    p.add_argument("--out", default="bench-out", help="folder for e2e.json and e2e.png")
    p.set_defaults(func=cmd_bench_e2e)
    p = bench_sub.add_parser("threads", help="batch-1 decode with and without Crucible's CPU thread priorities")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name or model path")
    p.add_argument("--context", type=POSITIVE, default=512, help="prompt tokens before decoding")
    p.add_argument("--steps", type=POSITIVE, default=64, help="decode steps per session")
    p.add_argument("--sessions", type=POSITIVE, default=3, help="sessions per child process")
    p.add_argument("--rounds", type=POSITIVE, default=3, help="child processes per configuration, alternating")
    p.add_argument("--out", default="bench-out", help="folder for threads.json")
    p.set_defaults(func=cmd_bench_threads)
    p = bench_sub.add_parser("api", help="structured output and penalties per decode step; prefix-cache TTFT")
    p.add_argument("--model", default=DEFAULT_MODEL, help="registry name or model path")
    p.add_argument("--streams", default="1,16", help="stream counts to time the decode step at")
    p.add_argument("--steps", type=POSITIVE, default=32, help="decode steps per configuration and round")
    p.add_argument("--rounds", type=POSITIVE, default=3, help="rounds; configurations take turns in each")
    p.add_argument("--out", default="bench-out", help="folder for api.json")
    p.set_defaults(func=cmd_bench_api)
    p = bench_sub.add_parser("serve", help="load-test servers: crucible, max serve, llama-server (or --url)")
    p.add_argument("--url", default=None, help="root URL of a running server (loopback) instead of spawning")
    p.add_argument("--systems", default="crucible,max,max-q4_0,llama.cpp", help="servers to spawn in turn")
    p.add_argument("--build-llama-cpp", action="store_true",
                   help="build llama.cpp from the llama-cpp-python sdist if not cached (~15 min on 2 cores)")
    p.add_argument("--reps", type=POSITIVE, default=3, help="runs of every system, in a shuffled order each")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model to spawn / to request")
    p.add_argument("--served-name", default=None, help="model id to request if it differs from --model")
    p.add_argument("--system", default="external", help="label for a --url server's results")
    p.add_argument("--levels", default="1,4,16,64", help="concurrency levels")
    p.add_argument("--max-requests", type=POSITIVE, default=64, help="requests per level at most")
    p.add_argument("--max-seconds", type=float, default=120.0, help="seconds per level at most")
    p.add_argument("--max-tokens", type=POSITIVE, default=128)
    p.add_argument("--api-key", default=None)
    p.add_argument("--out", default="bench-out")
    p.set_defaults(func=cmd_bench_serve)
    return parser


def wants_gpu(args: argparse.Namespace) -> bool:
    """Whether the subcommand was asked to run on a GPU (--device, --devices or --target gpu)."""
    return "gpu" in (getattr(args, "device", None), getattr(args, "devices", None), getattr(args, "target", None))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line and returns the exit status."""
    args = build_parser().parse_args(argv)
    prog = " ".join(["crucible", args.command, getattr(args, "bench_command", None) or ""]).strip()
    # Checked here, before anything loads (crucible.core.devices.max_device raises the same error later).
    if getattr(args, "dtype", "auto") == "bfloat16" and not wants_gpu(args):
        print(f"{prog}: error: --dtype bfloat16 runs on GPU only (the CPU kernels compute in float32)", file=sys.stderr)
        return USER_ERROR
    if wants_gpu(args) and gpu_count() == 0:
        print(f"{prog}: error: {NO_GPU}", file=sys.stderr)
        return USER_ERROR
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback (CRUCIBLE_DEBUG=1 shows it)
        return report(prog, exc)


if __name__ == "__main__":
    sys.exit(main())
