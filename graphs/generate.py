"""Greedy generation straight on a CrucibleModel and MAX's paged KV cache manager.

This is the smallest loop that exercises the graph the way serving does (ragged batches, prefill then
one-token decode steps, pages allocated as sequences grow and released at the end); the parity tests
and `crucible generate` use it. Continuous batching and sampling live in pipelines/.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graphs.model import CrucibleModel


@dataclass(frozen=True)
class StepBatch:
    """One step's inputs: the new tokens of every active sequence, ragged.

    Attributes:
        tokens: [T] int64.
        row_offsets: [B + 1] uint32.
        logit_rows: [B] int64, the last new token of each sequence.
    """

    tokens: np.ndarray
    row_offsets: np.ndarray
    logit_rows: np.ndarray


def make_step_batch(token_lists: Sequence[np.ndarray]) -> StepBatch:
    """Concatenates per-sequence new tokens into a ragged batch asking for each sequence's last logits."""
    lengths = np.array([len(t) for t in token_lists], dtype=np.int64)
    if (lengths == 0).any():
        raise ValueError("every sequence in a step needs at least one new token")
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
    return StepBatch(np.concatenate(token_lists).astype(np.int64), offsets, (offsets[1:] - 1).astype(np.int64))


def new_kv_manager(model: CrucibleModel, max_batch_size: int, total_tokens: int):
    """A PagedKVCacheManager sized for `total_tokens` across `max_batch_size` sequences."""
    from max.pipelines.kv_cache import PagedKVCacheManager

    pages = -(-total_tokens // model.options.page_size) + max_batch_size
    return PagedKVCacheManager(params=model.kv_params, session=model.session, total_num_pages=pages,
                               max_batch_size=max_batch_size)


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
            (one entry per step_times entry); the rest of a step is host work (KV inputs, argmax).

    Returns:
        The generated ids of each sequence.
    """
    from max import tree
    from max.pipelines.context import TextContext, TokenBuffer
    from max.pipelines.modeling.types import RequestID

    manager = new_kv_manager(model, len(prompts), sum(len(p) for p in prompts) + len(prompts) * max_new_tokens)
    ctxs = [TextContext(request_id=RequestID(), max_length=len(p) + max_new_tokens + 1,
                        tokens=TokenBuffer(np.asarray(p, dtype=np.int64))) for p in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    stops = set(stop_ids)
    try:
        for ctx in ctxs:
            manager.claim(ctx)
        if prefill_chunks:
            _chunked_prefill(model, manager, ctxs[0], prefill_chunks)
        active = list(range(len(ctxs)))
        while active:
            batch_ctxs = [ctxs[i] for i in active]
            for ctx in batch_ctxs:
                manager.alloc(ctx)
            kv = tree.flatten(manager.runtime_inputs([batch_ctxs]))[0]
            step = make_step_batch([np.asarray(c.tokens.active, dtype=np.int64) for c in batch_ctxs])
            t_exec = time.perf_counter()
            logits = model.execute(step.tokens, step.row_offsets, step.logit_rows, kv)
            if execute_times is not None:
                execute_times.append(time.perf_counter() - t_exec)
            still = []
            for row, i in enumerate(active):
                tok = int(np.argmax(logits[row]))
                ctxs[i].update(tok)
                manager.step(ctxs[i])
                outputs[i].append(tok)
                if tok not in stops and len(outputs[i]) < max_new_tokens:
                    still.append(i)
            if step_times is not None:
                step_times.append(time.perf_counter())
            active = still
    finally:
        for ctx in ctxs:
            manager.release(ctx)
    return outputs


def _chunked_prefill(model: CrucibleModel, manager, ctx, chunks: Sequence[int]) -> None:
    """Feeds all but the last chunk of the prompt as separate steps (their logits are discarded)."""
    from max import tree

    if sum(chunks) != len(ctx.tokens.active):
        raise ValueError("prefill chunks must add up to the prompt length")
    for size in chunks[:-1]:
        ctx.tokens.chunk(size)
        manager.alloc(ctx)
        kv = tree.flatten(manager.runtime_inputs([[ctx]]))[0]
        step = make_step_batch([np.asarray(ctx.tokens.active, dtype=np.int64)])
        model.execute(step.tokens, step.row_offsets, step.logit_rows, kv)
        ctx.tokens.advance_chunk()
        manager.step(ctx)


def full_logits(model: CrucibleModel, token_ids: Sequence[int]) -> np.ndarray:
    """[n, vocab] logits of every position of one sequence from a single prefill (for parity tests)."""
    from max import tree
    from max.pipelines.context import TextContext, TokenBuffer
    from max.pipelines.modeling.types import RequestID

    manager = new_kv_manager(model, 1, len(token_ids) + 1)
    ctx = TextContext(request_id=RequestID(), max_length=len(token_ids) + 1,
                      tokens=TokenBuffer(np.asarray(token_ids, dtype=np.int64)))
    manager.claim(ctx)
    try:
        manager.alloc(ctx)
        kv = tree.flatten(manager.runtime_inputs([[ctx]]))[0]
        n = len(token_ids)
        return model.execute(np.asarray(token_ids, np.int64), np.array([0, n], np.uint32),
                             np.arange(n, dtype=np.int64), kv)
    finally:
        manager.release(ctx)


def incremental_logits(model: CrucibleModel, token_ids: Sequence[int], n_prefill: int) -> np.ndarray:
    """Prefills the first n_prefill tokens, then feeds the rest one decode step at a time.

    Returns:
        [len - n_prefill + 1, vocab] logits predicting tokens n_prefill .. len (the prefill's last row,
        then one row per decode step), all read through the paged cache.
    """
    from max import tree
    from max.pipelines.context import TextContext, TokenBuffer
    from max.pipelines.modeling.types import RequestID

    ids = [int(t) for t in token_ids]
    manager = new_kv_manager(model, 1, len(ids) + 1)
    ctx = TextContext(request_id=RequestID(), max_length=len(ids) + 1,
                      tokens=TokenBuffer(np.asarray(ids[:n_prefill], dtype=np.int64)))
    manager.claim(ctx)
    rows = []
    try:
        for nxt in ids[n_prefill:] + [None]:
            manager.alloc(ctx)
            kv = tree.flatten(manager.runtime_inputs([[ctx]]))[0]
            step = make_step_batch([np.asarray(ctx.tokens.active, dtype=np.int64)])
            rows.append(model.execute(step.tokens, step.row_offsets, step.logit_rows, kv)[0])
            if nxt is None:
                break
            ctx.update(nxt)  # teacher forcing: the known next token, not the argmax
            manager.step(ctx)
    finally:
        manager.release(ctx)
    return np.stack(rows)
