"""Greedy generation and logits helpers on the model runner (graphs/runner.py).

The smallest loops that exercise the graph the way serving does (ragged batches, prefill then
one-token decode steps, pages allocated as sequences grow and released at the end), for the parity
tests, qualification and the kernel A/B benchmarks. Continuous batching and sampling live in pipelines/.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from graphs.model import CrucibleModel
from graphs.runner import ModelRunner


def greedy_generate(model: CrucibleModel, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    stop_ids: Sequence[int] = (), prefill_chunks: Sequence[int] | None = None,
                    step_times: list[float] | None = None,
                    execute_times: list[float] | None = None) -> list[list[int]]:
    """Generates greedily for a batch of prompts run together.

    Args:
        model: The compiled model.
        prompts: Token ids per sequence.
        max_new_tokens: Generated tokens per sequence at most.
        stop_ids: Ids that end a sequence (kept in its output).
        prefill_chunks: If given, the first prompt is prefilled in chunks of these sizes (prefill with
            history); they must sum to its length.
        step_times: If given, time.perf_counter() is appended after each step's tokens are chosen
            (the first entry ends the prefill; the e2e benchmark reads them).
        execute_times: If given, the seconds each step spent in the graph execution alone are appended
            (one entry per step_times entry); the rest of a step is host work (KV inputs, token ids).

    Returns:
        The generated ids of each sequence.
    """
    runner = ModelRunner.for_tokens(model, sum(len(p) for p in prompts) + len(prompts) * max_new_tokens,
                                    len(prompts))
    seqs = [runner.start(p, len(p) + max_new_tokens + 1) for p in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    stops = set(stop_ids)
    try:
        if prefill_chunks:
            if sum(prefill_chunks) != len(prompts[0]):
                raise ValueError("prefill chunks must add up to the prompt length")
            for size in prefill_chunks[:-1]:  # all but the last chunk; their logits are not needed
                runner.step([seqs[0]], [size])
                runner.advance(seqs[0], None)
        runner.record_times = execute_times is not None
        active = list(range(len(seqs)))
        while active:
            ids = runner.step([seqs[i] for i in active], tokens_only=True)  # argmax on the device: [len(active)]
            if execute_times is not None:
                execute_times.append(runner.execute_seconds[-1])
            still = []
            for row, i in enumerate(active):
                tok = int(ids[row])
                runner.advance(seqs[i], tok)
                outputs[i].append(tok)
                if tok not in stops and len(outputs[i]) < max_new_tokens:
                    still.append(i)
            if step_times is not None:
                step_times.append(time.perf_counter())
            active = still
    finally:
        for seq in seqs:
            runner.release(seq)
    return outputs


def full_logits(model: CrucibleModel, token_ids: Sequence[int]) -> np.ndarray:
    """[n, vocab] logits of every position of one sequence from a single prefill (for parity tests)."""
    runner = ModelRunner.for_tokens(model, len(token_ids) + 1, 1)
    seq = runner.start(token_ids, len(token_ids) + 1)
    try:
        runner.prepare(seq)
        return runner.execute([seq], all_positions=True)
    finally:
        runner.release(seq)


def incremental_logits(model: CrucibleModel, token_ids: Sequence[int], n_prefill: int) -> np.ndarray:
    """Prefills the first n_prefill tokens, then feeds the rest one decode step at a time.

    Returns:
        [len - n_prefill + 1, vocab] logits predicting tokens n_prefill .. len (the prefill's last row,
        then one row per decode step), all read through the paged cache.
    """
    ids = [int(t) for t in token_ids]
    runner = ModelRunner.for_tokens(model, len(ids) + 1, 1)
    seq = runner.start(ids[:n_prefill], len(ids) + 1)
    rows = []
    try:
        for nxt in ids[n_prefill:] + [None]:
            rows.append(runner.step([seq])[0])
            if nxt is None:
                break
            runner.advance(seq, nxt)  # teacher forcing: the known next token, not the argmax
    finally:
        runner.release(seq)
    return np.stack(rows)
