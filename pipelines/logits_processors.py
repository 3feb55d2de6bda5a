"""logit_bias and the penalties, applied to a step's logits in one batched pass, then grammar masks.

Order and semantics, as vLLM applies them (each checked against a per-row reference in
tests/pipelines/test_logits_processors.py):
1. logit_bias: added to the token's logit (OpenAI).
2. repetition_penalty: vLLM's (from CTRL): a token seen in the prompt or the output has its logit divided
   by the penalty when positive and multiplied when negative.
3. presence_penalty / frequency_penalty: OpenAI's `logit[t] -= count[t] * frequency + (count[t] > 0) *
   presence`, counting the tokens generated so far (not the prompt), as OpenAI and vLLM do.
Only rows that ask for one of these are touched, and within them only the tokens involved (the prompt's
and output's, a few biased ones): the cost follows the tokens, not batch x vocabulary, and a batch
without any of these costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipelines.grammar import GrammarMatcher
from pipelines.sampling import SamplingParams

FLOAT32_MAX = float(np.finfo(np.float32).max)


def apply_penalties(logits: np.ndarray, params: Sequence[SamplingParams], prompt_ids: Sequence[Sequence[int]],
                    output_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """Applies logit_bias and the penalties of every row that has any.

    Args:
        logits: [B, vocab] float32 logits of each sequence's next token (not modified).
        params: [B] each row's sampling parameters.
        prompt_ids: [B] each row's prompt tokens (repetition_penalty only).
        output_ids: [B] each row's generated tokens so far.

    Returns:
        [B, vocab] the processed logits: `logits` itself when no row asks for anything.
    """
    rows = [i for i, p in enumerate(params) if p.penalized]
    if not rows:
        return logits
    out = logits.copy()  # the raw logits stay as they are: logprobs are reported from them
    vocab = logits.shape[1]
    flat = out.reshape(-1)  # [B * vocab] view: every update below touches only the tokens involved

    def positions(token_lists: list[Sequence[int]]) -> np.ndarray:
        # flat indices row * vocab + token of ragged per-row token lists
        parts = [i * vocab + np.asarray(t, dtype=np.int64) for i, t in zip(rows, token_lists) if len(t)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    bias = [(i * vocab + t, b) for i in rows for t, b in params[i].logit_bias if t < vocab]
    if bias:
        at, value = (np.array(x) for x in zip(*bias))
        np.add.at(flat, at, value.astype(np.float32))

    generated, counts = np.unique(positions([output_ids[i] for i in rows]), return_counts=True)
    rep = np.ones(len(params), dtype=np.float64)  # float32 would round a tiny penalty to 0 (a 1/0 logit)
    rep[rows] = [params[i].repetition_penalty for i in rows]
    if (rep != 1.0).any():
        seen = np.union1d(generated, positions([prompt_ids[i] for i in rows]))  # in the prompt or the output
        z, p = flat[seen].astype(np.float64), rep[seen // vocab]
        # An extreme penalty saturates at float32's largest finite logit instead of overflowing to inf.
        flat[seen] = np.clip(np.where(z > 0, z / p, z * p), -FLOAT32_MAX, FLOAT32_MAX)

    freq = np.array([p.frequency_penalty for p in params], dtype=np.float32)
    pres = np.array([p.presence_penalty for p in params], dtype=np.float32)
    row = generated // vocab
    flat[generated] -= freq[row] * counts + pres[row]
    return out


def process_logits(logits: np.ndarray, params: Sequence[SamplingParams], prompt_ids: Sequence[Sequence[int]],
                   output_ids: Sequence[Sequence[int]], matchers: Sequence[GrammarMatcher | None]) -> np.ndarray:
    """The penalties of every row (one batched pass), then each constrained row's grammar mask.

    Args:
        logits: [B, vocab] raw logits (not modified).
        params, prompt_ids, output_ids: [B] as for apply_penalties.
        matchers: [B] each row's grammar matcher, or None for a free row.

    Returns:
        [B, vocab] processed logits (banned tokens at -inf).
    """
    out = apply_penalties(logits, params, prompt_ids, output_ids)
    if any(m is not None for m in matchers) and out is logits:
        out = logits.copy()
    for row, matcher in zip(out, matchers):
        if matcher is not None:
            matcher.mask(row)
    return out
