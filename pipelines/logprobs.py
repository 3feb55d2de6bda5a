"""Log-probabilities of generated tokens, as OpenAI's `logprobs` / `top_logprobs` report them.

They are taken from the model's raw distribution (log-softmax of the logits, before temperature,
top-k or top-p), the convention of vLLM and of OpenAI's greedy outputs, so the same prompt reports the
same numbers whatever the sampling settings.
"""

from __future__ import annotations

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
