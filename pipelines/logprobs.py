"""Log-probabilities of generated tokens, as OpenAI's `logprobs` / `top_logprobs` report them.

They are taken from the model's raw distribution (log-softmax of the logits, before temperature,
top-k or top-p), the convention of vLLM and of OpenAI's greedy outputs, so the same prompt reports the
same numbers whatever the sampling settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives at its position.

    Attributes:
        token_id: The generated token.
        logprob: Its natural-log probability.
        top: (token id, logprob) of the `n` most likely tokens, most likely first.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprob(logits: np.ndarray, token_id: int, n_top: int) -> TokenLogprob:
    """Log-probability of `token_id` under one row of logits [vocab], with the `n_top` best tokens.

    Args:
        logits: Raw logits of one position, [vocab].
        token_id: The token that was generated.
        n_top: Alternatives to report (0 to MAX_TOP_LOGPROBS).

    Returns:
        The token's record; ties in `top` are broken by the lower token id.
    """
    z = logits.astype(np.float64)
    z = z - z.max()
    logp = z - np.log(np.exp(z).sum())
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        k = min(n_top, logp.size)
        best = np.argpartition(-logp, k - 1)[:k]
        best = sorted(best.tolist(), key=lambda i: (-logp[i], i))
        top = tuple((int(i), float(logp[i])) for i in best)
    return TokenLogprob(int(token_id), float(logp[token_id]), top)


def chunk_prompt_logprobs(logits: np.ndarray, prompt_ids: Sequence[int], start: int,
                          n_top: int) -> list[TokenLogprob | None]:
    """The prompt logprobs that one prefill chunk's logits give (echo with logprobs).

    Args:
        logits: [k, vocab] raw logits of the chunk's k prompt positions start .. start + k - 1; row j
            predicts prompt token start + j + 1 (the last row of the last chunk predicts the first
            generated token and is not a prompt logprob).
        prompt_ids: The whole prompt.
        start: Prompt tokens before the chunk.
        n_top: Alternatives per token.

    Returns:
        The entries for prompt tokens start + 1 .. start + k, led by None for token 0 (nothing predicts
        it) when the chunk is the first.
    """
    out: list[TokenLogprob | None] = [None] if start == 0 else []
    for j in range(min(len(logits), len(prompt_ids) - start - 1)):
        out.append(token_logprob(logits[j], prompt_ids[start + j + 1], n_top))
    return out
