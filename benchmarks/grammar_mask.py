"""Per-token cost of grammar-constrained decoding masks: llguidance vs xgrammar, SmolLM2 tokenizer.

A constrained sampler pays, at every decode step of every constrained stream, for (1) filling the
allowed-token bitmask from the matcher's state, (2) applying it to the logits row (-inf where banned)
and (3) advancing the matcher with the sampled token; once per request it pays for compiling the
grammar and making a matcher. On 2 CPU cores these sit on the critical path next to the model, so
this measures them for both libraries on the 49,152-token vocabulary, for any-JSON-object and for a
JSON schema, by walking valid documents token by token (every consumed token is checked to be
allowed by the mask). It also times 16 streams at the same step (loop and each library's batch API)
and records what each library says for JSON-schema features it does not implement.

Two tokenizer fixes are built in, both needed on this GGUF-converted tokenizer: llguidance.hf's
from_tokenizer reads its decoder (Sequence[ByteFallback, Fuse, Replace, ByteLevel]) as byte-fallback,
takes 'Ġ'/'Ċ' literally and rejects every space/newline token, so a plain ByteLevel decoder is swapped
in; xgrammar's TokenizerInfo.from_huggingface treats the 17 added special tokens (<|im_start|>, ...)
as text and allows them inside JSON strings, so they are given empty strings (= special to xgrammar).
Dependency note: `import xgrammar` imports torch (and its wheel requires torch and triton), which this
project installs only with the `test` extra; llguidance needs numpy (and transformers for .hf) only.

Run: .venv/bin/python -m benchmarks.grammar_mask [--reps 20]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from crucible.core.registry import DEFAULT_MODEL, resolve_model
from crucible.core.tokenizer import load_tokenizer
from graphs.config import load_config
from pipelines.grammar import llguidance_tokenizer

VOCAB = 49152
WORDS = (VOCAB + 31) // 32  # 1536 int32 words per mask row
STREAMS = 16
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "city"],
            "additionalProperties": False,  # xgrammar's default (strict_mode); llguidance's is JSON Schema's
        },
        "bio": {"type": "string"},
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
GRAMMARS: dict[str, dict[str, Any]] = {"json_object": {"type": "object"}, "json_schema": SCHEMA}
UNSUPPORTED: dict[str, dict[str, Any]] = {
    "unknown format": {"type": "string", "format": "uri-reference-template-x"},
    "external $ref": {"$ref": "https://example.com/schemas/person.json"},
    "patternProperties": {"type": "object", "patternProperties": {"^x-": {"type": "integer"}}},
    "if/then/else": {"if": {"type": "string"}, "then": {"minLength": 2}, "else": {"type": "integer"}},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
}


def make_doc(i: int) -> str:
    """The i-th valid document for SCHEMA (values vary per stream), compact-ish JSON text."""
    roles = ["admin", "user", "guest"]
    doc = {
        "name": f"User Number {i} O'Brien-Smith", "age": 20 + 3 * i, "role": roles[i % 3],
        "tags": ["python", "rust", f"team-{i}", "on-call", "grammar"][: 2 + i % 4],
        "address": {"street": f"{100 + i} Main Street", "city": ["Paris", "Zürich", "Oslo"][i % 3], "zip": f"{7500 + i}"},
        "bio": "Writes constrained decoders; likes \"quotes\", tabs\tand unicode: café ✓.",
    }
    return json.dumps(doc, ensure_ascii=False)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def stats_us(ns: list[int]) -> tuple[float, float, float]:
    """(mean, p50, p99) in microseconds of nanosecond samples."""
    a = np.asarray(ns, dtype=np.float64) / 1e3
    return float(a.mean()), float(np.percentile(a, 50)), float(np.percentile(a, 99))


def apply_np(logits: np.ndarray, row: np.ndarray) -> None:
    """logits [VOCAB] float32, row [WORDS] int32: bit j of the row (LSB first) = token j allowed."""
    allowed = np.unpackbits(row.view(np.uint8), bitorder="little")[: logits.shape[0]]  # [VOCAB] uint8
    logits[allowed == 0] = -np.inf


def is_allowed(row: np.ndarray, token: int) -> bool:  # row [WORDS] int32
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


class Lib:
    """One library behind a common surface: compile, new matcher, fill, consume, batch fill, errors."""

    name: str
    compile: Callable[[dict[str, Any]], Any]  # schema -> compiled grammar
    new: Callable[[Any], Any]  # compiled -> per-request matcher
    fill: Callable[[Any, np.ndarray, int], None]  # matcher, bitmask [B, WORDS], row
    consume: Callable[[Any, int], bool]
    batch_fill: Callable[[list[Any], np.ndarray], None]  # matchers, bitmask [len, WORDS]
    apply_lib: Callable[[np.ndarray, np.ndarray], None]  # logits [1, VOCAB], bitmask [1, WORDS]
    error: Callable[[dict[str, Any]], str]


def llguidance_lib(tok: Any, eos: list[int]) -> Lib:
    import llguidance
    import llguidance.numpy as lnp

    llt = llguidance_tokenizer(tok, VOCAB, eos)  # built once (~0.4 s); fixes the GGUF decoder (pipelines/grammar.py)
    executor = llguidance.LLExecutor(num_threads=os.cpu_count())
    lib = Lib()
    lib.name = "llguidance"

    def compile_(schema: dict[str, Any]) -> llguidance.LLMatcher:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)  # JSON text; LLMatcher() compiles
        m = llguidance.LLMatcher(llt, grammar, log_level=0)  # never raises on bad input: check is_error()
        assert not m.is_error(), m.get_error()
        return m  # kept as the template; a fresh LLMatcher per request starts with cold lexer caches

    def error(schema: dict[str, Any]) -> str:
        m = llguidance.LLMatcher(llt, llguidance.LLMatcher.grammar_from_json_schema(schema), log_level=0)
        return m.get_error() if m.is_error() else "accepted (no error)"

    lib.compile = compile_
    lib.new = lambda template: template.deep_copy()  # copies share the template's warm lexer cache
    lib.fill = lambda m, bm, i: lnp.fill_next_token_bitmask(m, bm, i)
    lib.consume = lambda m, t: m.consume_token(t)
    lib.batch_fill = lambda ms, bm: lnp.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(ms)], bm)
    lib.apply_lib = lnp.apply_token_bitmask_inplace
    lib.error = error
    return lib


def xgrammar_lib(tok: Any, eos: list[int]) -> Lib:
    import torch
    import xgrammar as xgr

    vocab = [""] * VOCAB  # token strings by id, byte-level ('Ġ' = space); "" marks a special token
    for text, i in tok.get_vocab().items():
        vocab[i] = "" if i in tok.added_tokens_decoder and tok.added_tokens_decoder[i].special else text
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=VOCAB, stop_token_ids=eos)  # once
    compiler = xgr.GrammarCompiler(info, max_threads=os.cpu_count() or 1, cache_enabled=False)
    batcher = xgr.BatchGrammarMatcher(max_threads=os.cpu_count() or 1)
    lib = Lib()
    lib.name = "xgrammar"

    def error(schema: dict[str, Any]) -> str:
        try:
            compiler.compile_json_schema(json.dumps(schema))
        except Exception as e:  # noqa: BLE001 - we record whatever it raises
            return f"{type(e).__name__}: {e}"
        return "accepted (no error)"

    lib.compile = lambda s: compiler.compile_json_schema(json.dumps(s))
    lib.new = lambda cg: xgr.GrammarMatcher(cg)
    lib.fill = lambda m, bm, i: m.fill_next_token_bitmask(bm, i)  # numpy via DLPack, no copy
    lib.consume = lambda m, t: m.accept_token(t)
    lib.batch_fill = lambda ms, bm: batcher.batch_fill_next_token_bitmask(ms, bm)
    lib.apply_lib = lambda lg, bm: xgr.apply_token_bitmask_inplace(torch.from_numpy(lg), torch.from_numpy(bm))
    lib.error = error
    return lib


def walk(lib: Lib, compiled: Any, docs: list[list[int]], eos: int, reps: int) -> dict[str, Any]:
    """Walks docs[0] `reps` times with a fresh matcher each time; times fill/apply/consume per token."""
    bm = np.zeros((1, WORDS), dtype=np.int32)  # [1, WORDS]
    logits0 = np.random.default_rng(0).standard_normal((1, VOCAB)).astype(np.float32)  # [1, VOCAB]
    logits = logits0.copy()
    out: dict[str, list[int]] = {k: [] for k in ("new", "first", "fill", "apply", "apply_lib", "consume", "allowed")}
    for _ in range(reps):
        t0 = time.perf_counter_ns(); m = lib.new(compiled); out["new"].append(time.perf_counter_ns() - t0)
        for step, tok in enumerate(docs[0] + [eos]):
            t0 = time.perf_counter_ns(); lib.fill(m, bm, 0); t1 = time.perf_counter_ns()
            out["first" if step == 0 else "fill"].append(t1 - t0)
            assert is_allowed(bm[0], tok), f"{lib.name}: token {tok} at step {step} not in mask"
            np.copyto(logits, logits0)
            t0 = time.perf_counter_ns(); apply_np(logits[0], bm[0]); out["apply"].append(time.perf_counter_ns() - t0)
            out["allowed"].append(int(np.isfinite(logits).sum()))
            np.copyto(logits, logits0)
            t0 = time.perf_counter_ns(); lib.apply_lib(logits, bm); out["apply_lib"].append(time.perf_counter_ns() - t0)
            t0 = time.perf_counter_ns(); ok = lib.consume(m, tok); out["consume"].append(time.perf_counter_ns() - t0)
            assert ok, f"{lib.name}: token {tok} at step {step} rejected"
    return out


def streams(lib: Lib, compiled: Any, docs: list[list[int]]) -> tuple[list[int], list[int]]:
    """Per-step ns to fill STREAMS masks: a loop of single fills, and the library's batch call."""
    bm = np.zeros((STREAMS, WORDS), dtype=np.int32)  # [STREAMS, WORDS]
    loop_ms = [lib.new(compiled) for _ in range(STREAMS)]
    batch_ms = [lib.new(compiled) for _ in range(STREAMS)]
    seq, par = [], []
    for step in range(min(len(d) for d in docs)):
        t0 = time.perf_counter_ns()
        for i, m in enumerate(loop_ms):
            lib.fill(m, bm, i)
        seq.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns(); lib.batch_fill(batch_ms, bm); par.append(time.perf_counter_ns() - t0)
        for i, d in enumerate(docs):
            assert is_allowed(bm[i], d[step]), f"{lib.name}: batch mask stream {i} step {step}"
            assert lib.consume(loop_ms[i], d[step]) and lib.consume(batch_ms[i], d[step])
    return seq, par


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="walks of the document per library and grammar")
    args = parser.parse_args()
    source = resolve_model(DEFAULT_MODEL)
    tok = load_tokenizer(source)
    eos = list(load_config(source).eos_token_ids)  # [2] <|im_end|>; tok.eos_token_id says 1 for this GGUF
    docs = [tok.encode(make_doc(i), add_special_tokens=False) for i in range(STREAMS)]  # [STREAMS][tokens]
    libs = [llguidance_lib(tok, eos)]
    try:  # not a dependency (it imports torch): compared when installed (pip install xgrammar)
        libs.append(xgrammar_lib(tok, eos))
    except ImportError:
        print("# xgrammar is not installed: llguidance alone")
    setup, per_tok, multi, errors = [], [], [], []
    for lib in libs:
        for gname, schema in GRAMMARS.items():
            times = []
            for _ in range(5):
                t0 = time.perf_counter_ns(); compiled = lib.compile(schema); times.append(time.perf_counter_ns() - t0)
            r = walk(lib, compiled, docs, eos[0], args.reps)
            setup.append((lib.name, gname, np.median(times) / 1e6, np.median(r["new"]) / 1e3, np.median(r["first"]) / 1e3))
            per_tok.append((lib.name, gname, len(docs[0]) + 1, float(np.mean(r["allowed"])),
                            *stats_us(r["fill"]), *stats_us(r["apply"]), *stats_us(r["apply_lib"])[:2], *stats_us(r["consume"])))
            seq, par = streams(lib, compiled, docs)
            multi.append((lib.name, gname, len(seq), *(x / 1e3 for x in stats_us(seq)), *(x / 1e3 for x in stats_us(par))))
        errors += [(lib.name, k, lib.error(s).replace("\n", " ")[:110]) for k, s in UNSUPPORTED.items()]

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    vers = ", ".join(f"{p} {_version(p)}" for p in ("llguidance", "xgrammar", "numpy", "transformers"))
    print(f"# {vers}; CPU: {cpu} x{os.cpu_count()}; vocab {VOCAB}; reps {args.reps}; doc {len(docs[0])} tokens + eos")
    print("\n## setup               compile ms (median of 5)   new matcher us   first mask us")
    for lib_name, g, c, n, f in setup:
        print(f"{lib_name:11s} {g:12s} {c:12.3f} {n:24.1f} {f:15.1f}")
    print("\n## per token, us        tokens allowed |   fill mean/p50/p99   |  apply(np) mean/p50/p99 | apply(lib) mean/p50 | consume mean/p50/p99")
    for lib_name, g, n, al, *v in per_tok:
        print(f"{lib_name:11s} {g:12s} {n:5d} {al:7.0f} | {v[0]:6.1f} {v[1]:6.1f} {v[2]:7.1f} | {v[3]:6.1f} {v[4]:6.1f} {v[5]:7.1f} "
              f"| {v[6]:8.1f} {v[7]:8.1f} | {v[8]:6.1f} {v[9]:6.1f} {v[10]:7.1f}")
    print(f"\n## {STREAMS} streams, ms per step   steps | loop fill mean/p50/p99 | batch fill mean/p50/p99")
    for lib_name, g, n, *v in multi:
        print(f"{lib_name:11s} {g:12s} {n:5d} | {v[0]:6.3f} {v[1]:6.3f} {v[2]:6.3f}  | {v[3]:6.3f} {v[4]:6.3f} {v[5]:6.3f}")
    print("\n## unsupported JSON-schema features")
    for lib_name, k, msg in errors:
        print(f"{lib_name:11s} {k:18s} {msg}")


if __name__ == "__main__":
    main()
