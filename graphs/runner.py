"""The model runner: one compiled model, its paged KV cache, and one ragged step at a time.

Everything that runs the decoder goes through it: the engine (pipelines/engine.py) and the greedy
and parity helpers (graphs/generate.py), and through them the CLI, the benchmarks and qualification.
A sequence's life: `start` (claims a cache slot) -> per step `prepare` (chunk its new tokens, allocate
pages) and `execute` with the others -> `advance` (commit the step to the cache) -> `release`.
The runner owns the KV capacity: how many pages fit in memory and what a page costs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

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


def kv_page_bytes(model: CrucibleModel) -> int:
    """Bytes of one KV cache page (K and V of `page_size` tokens in every layer), as MAX's cache counts them."""
    return int(model.kv_params.bytes_per_block)


class ModelRunner:
    """Runs ragged steps of one model over its own paged KV cache.

    Args:
        model: The compiled model.
        total_pages: KV cache pages in all.
        max_batch_size: Sequences in one step at most.
        prefix_caching: Reuse the KV pages of a prompt prefix already in the cache (MAX's prefix cache,
            whole pages only): `prepare` skips those tokens.
    """

    def __init__(self, model: CrucibleModel, total_pages: int, max_batch_size: int,
                 prefix_caching: bool = False) -> None:
        from max.pipelines.kv_cache import PagedKVCacheManager

        self.model = model
        self.max_batch_size = max_batch_size
        self.prefix_caching = prefix_caching
        params = replace(model.kv_params, enable_prefix_caching=prefix_caching)
        self.kv = PagedKVCacheManager(params=params, session=model.session, total_num_pages=total_pages,
                                      max_batch_size=max_batch_size)
        self._pages_total = int(self.kv.block_count().total)  # fixed for the cache's life: read once
        self.execute_seconds: list[float] = []  # graph time of each execute (the rest of a step is host work)
        self.record_times = False

    @classmethod
    def for_memory(cls, model: CrucibleModel, gib: float, max_batch_size: int,
                   prefix_caching: bool = False) -> ModelRunner:
        """A runner whose cache takes `gib` GiB (at least one page)."""
        return cls(model, max(1, int(gib * 2**30 // kv_page_bytes(model))), max_batch_size, prefix_caching)

    @classmethod
    def for_tokens(cls, model: CrucibleModel, total_tokens: int, max_batch_size: int) -> ModelRunner:
        """A runner whose cache holds `total_tokens` across `max_batch_size` sequences (page rounding included)."""
        return cls(model, -(-total_tokens // model.options.page_size) + max_batch_size, max_batch_size)

    # -- sequences ----------------------------------------------------------------------------------
    def start(self, prompt_ids: Sequence[int], max_length: int):
        """A new sequence holding the prompt, with a cache slot claimed (pages come with `prepare`).

        Args:
            prompt_ids: The prompt's token ids.
            max_length: Tokens the sequence may ever hold (prompt + generated + 1).

        Returns:
            MAX's TextContext for the sequence.
        """
        from max.pipelines.context import TextContext, TokenBuffer
        from max.pipelines.modeling.types import RequestID

        seq = TextContext(request_id=RequestID(), max_length=max_length,
                          tokens=TokenBuffer(np.asarray(prompt_ids, dtype=np.int64)))
        self.kv.claim(seq)
        return seq

    def prepare(self, seq, n_tokens: int | None = None, reuse_prefix: bool = True) -> int:
        """Readies a sequence for the next step: pages, then its next `n_tokens` new tokens (all when None).

        With prefix caching, the pages of a cached prefix are taken first and those tokens skipped (the
        new tokens then start after them); `reuse_prefix=False` computes every token (its logits are
        wanted, e.g. prompt logprobs).

        Returns:
            Tokens skipped because their KV pages came from the prefix cache.
        """
        before = seq.tokens.processed_length
        if self.prefix_caching and not reuse_prefix:
            manager = self.kv._block_manager  # MAX has no per-request switch: skip the lookup for this call
            manager.enable_prefix_caching = False
            try:
                self.kv.alloc(seq)
            finally:
                manager.enable_prefix_caching = True
        else:
            self.kv.alloc(seq)  # MAX's order: reuse cached pages, allocate the rest, then chunk
        if n_tokens is not None and n_tokens < seq.tokens.active_length:
            seq.tokens.chunk(n_tokens)
        return seq.tokens.processed_length - before

    def execute(self, seqs: Sequence, all_positions: bool = False, tokens_only: bool = False) -> np.ndarray:
        """Runs one step over prepared sequences.

        Args:
            seqs: The sequences, each prepared for this step.
            all_positions: Return logits of every new token (one sequence only), not just the last.
            tokens_only: Return each row's argmax (computed on the device) instead of its logits.

        Returns:
            [len(seqs), vocab] float32 logits of each sequence's last new token, or [n_new, vocab];
            with tokens_only, [len(seqs)] (or [n_new]) int64 ids.
        """
        from max import tree

        kv = tree.flatten(self.kv.runtime_inputs([list(seqs)]))[0]
        batch = make_step_batch([np.asarray(s.tokens.active, dtype=np.int64) for s in seqs])
        rows = batch.logit_rows
        if all_positions:
            if len(seqs) != 1:
                raise ValueError("all_positions takes one sequence")
            rows = np.arange(len(batch.tokens), dtype=np.int64)
        start = time.perf_counter()
        logits = self.model.execute(batch.tokens, batch.row_offsets, rows, kv, tokens_only=tokens_only)
        if self.record_times:
            self.execute_seconds.append(time.perf_counter() - start)
        return logits

    def step(self, seqs: Sequence, n_tokens: Sequence[int | None] | None = None,
             tokens_only: bool = False) -> np.ndarray:
        """`prepare` each sequence, then `execute` them together: [len(seqs), vocab] logits (or [len(seqs)]
        argmax ids with tokens_only)."""
        for i, seq in enumerate(seqs):
            self.prepare(seq, None if n_tokens is None else n_tokens[i])
        return self.execute(seqs, tokens_only=tokens_only)

    def advance(self, seq, token: int | None) -> None:
        """Commits the step: the next token drawn after it, or None after a prompt chunk."""
        if token is None:
            seq.tokens.advance_chunk()
        else:
            seq.update(token)
        self.kv.step(seq)

    def release(self, seq) -> None:
        """Frees the sequence's pages and slot."""
        self.kv.release(seq)

    # -- capacity -----------------------------------------------------------------------------------
    @property
    def page_size(self) -> int:
        return self.model.options.page_size

    def pages_total(self) -> int:
        return self._pages_total

    def pages_used(self) -> int:
        """Pages MAX's cache manager reports in use (0 when no sequence holds any)."""
        return self.kv.block_count().used
