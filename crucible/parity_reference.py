"""transformers' logits of a model, saved for where transformers does not run, and our model compared
with them (benchmarks/model_parity.py, the GPU device steps and `crucible qualify --reference`).

A saved reference keeps, per position, the logits at the 64 highest ids and at 2048 fixed random ids
(the diff is taken over those), plus the full row's top-1, max |logit| and the vocabulary size (a
reference of another model is refused). Our side also generates greedily through the paged cache.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
)
TOP_IDS, SAMPLED_IDS = 64, 2048  # vocab ids kept per position in a saved reference


@dataclass(frozen=True)
class RefRow:
    """transformers' side of one prompt.

    Attributes:
        prompt: The user message.
        prompt_ids: The chat-templated prompt's token ids.
        greedy: transformers' greedy continuation (token ids).
        text: Its text.
        cols: [positions, C] int vocab ids the logits are kept at, or None for every id.
        logits: [positions, C] (or [positions, vocab]) float32 logits of prompt_ids + greedy.
        top1: [positions] the full row's argmax.
        max_abs: The full rows' max |logit|.
        vocab: The reference model's vocabulary size (a saved reference is checked against the model).
    """

    prompt: str
    prompt_ids: list[int]
    greedy: list[int]
    text: str
    cols: np.ndarray | None
    logits: np.ndarray
    top1: np.ndarray
    max_abs: float
    vocab: int | None = None


def reference_rows(model_name: str, tokens: int) -> list[RefRow]:
    """transformers' greedy continuations and full logits for PROMPTS."""
    from crucible.reference import Reference

    ref = Reference(model_name)
    rows = []
    for prompt in PROMPTS:
        ids = ref.chat_prompt_ids([{"role": "user", "content": prompt}])
        cont = ref.greedy(ids, tokens)
        logits = ref.logits(ids + cont.token_ids).astype(np.float32)
        rows.append(RefRow(prompt, list(ids), list(cont.token_ids), cont.text, None, logits,
                           logits.argmax(-1), float(np.abs(logits).max()), int(logits.shape[1])))
    return rows


def save_reference(rows: list[RefRow], path: Path, seed: int = 0) -> None:
    """Writes the rows with their logits kept at the top and at fixed random ids (see the docstring)."""
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for i, r in enumerate(rows):
        vocab = r.logits.shape[1]
        sampled = np.random.default_rng(seed).choice(vocab, size=min(SAMPLED_IDS, vocab), replace=False)
        top = np.argsort(-r.logits, axis=1)[:, :TOP_IDS]
        cols = np.concatenate([top, np.broadcast_to(sampled, (len(top), len(sampled)))], axis=1).astype(np.int32)
        arrays[f"cols{i}"] = cols
        arrays[f"logits{i}"] = np.take_along_axis(r.logits, cols, axis=1)
        arrays[f"top1_{i}"] = r.top1.astype(np.int32)
        meta.append({"prompt": r.prompt, "prompt_ids": r.prompt_ids, "greedy": r.greedy, "text": r.text,
                     "max_abs": r.max_abs, "vocab": int(vocab)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, meta=np.array(json.dumps(meta)), **arrays)
    tmp.replace(path)


def load_reference(path: Path) -> list[RefRow]:
    """Rows written by save_reference."""
    with np.load(path) as z:
        meta = json.loads(str(z["meta"]))
        return [RefRow(m["prompt"], m["prompt_ids"], m["greedy"], m["text"], z[f"cols{i}"], z[f"logits{i}"],
                       z[f"top1_{i}"], m["max_abs"], m.get("vocab")) for i, m in enumerate(meta)]


def compare(model, rows: list[RefRow], bound: float, top1_fraction: float) -> tuple[bool, list[dict]]:
    """Our logits and greedy tokens against the reference rows.

    Args:
        model: A CrucibleModel.
        rows: The reference.
        bound: Largest max |diff| / max |logit| that passes.
        top1_fraction: Share of positions whose top-1 must agree (1.0: every one).

    Returns:
        (passed, one record per prompt).
    """
    from graphs.generate import full_logits, greedy_generate

    out = []
    for r in rows:
        if r.vocab is not None and r.vocab != model.config.vocab_size:
            raise ValueError(f"the reference is of a model with {r.vocab} vocabulary entries, this one has "
                             f"{model.config.vocab_size}: a reference of another model")
        seq = r.prompt_ids + r.greedy
        start = time.perf_counter()
        ours = full_logits(model, seq)
        seconds = time.perf_counter() - start
        kept = ours if r.cols is None else np.take_along_axis(ours, r.cols.astype(np.int64), axis=1)
        diff = float(np.abs(kept - r.logits).max())
        agree = float((ours.argmax(-1) == r.top1).mean())
        greedy = greedy_generate(model, [r.prompt_ids], len(r.greedy), stop_ids=model.config.eos_token_ids)[0]
        out.append({"prompt": r.prompt, "positions": len(seq), "generated": r.text, "max_abs_diff": diff,
                    "max_abs_logit": r.max_abs, "ratio": diff / r.max_abs, "top1_agreement": agree,
                    "top1_equal": agree == 1.0, "greedy_identical": greedy == r.greedy,
                    "compared_ids": "all" if r.cols is None else int(r.cols.shape[1]),
                    "ours_seconds": round(seconds, 3)})
        print(f"{len(seq):4d} positions  ratio {diff / r.max_abs:.3g}  top-1 agreement {agree:.3f}  greedy "
              f"identical {greedy == r.greedy}  {r.prompt[:40]!r} -> {r.text[:60]!r}", flush=True)
    passed = all(o["ratio"] <= bound and o["top1_agreement"] >= top1_fraction for o in out)
    return passed, out
