"""Sampling parameters as users give them to an OpenAI-style API, and the sampler that applies them.

Order of operations on one row of logits, as vLLM applies them: logit_bias and the penalties (batched,
pipelines/logits_processors.py), then the grammar mask (pipelines/grammar.py), then temperature, top_k,
top_p and min_p here. temperature 0 means greedy (the argmax of the penalized, masked logits). A seed
makes a request's draws reproducible (same seed, same prompt, same output), independent of what else
is in the batch, because every request draws from its own generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipelines.grammar import Grammar
from pipelines.logprobs import MAX_TOP_LOGPROBS

DEFAULT_MAX_TOKENS = 512
# Seeds are 64-bit signed integers, the range OpenAI's API and vLLM accept.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_N = 8                  # sequences per request (`n`); they share the prompt's KV pages
PENALTY_RANGE = (-2.0, 2.0)  # presence_penalty and frequency_penalty, as OpenAI bounds them
BIAS_RANGE = (-100.0, 100.0)  # logit_bias values, as OpenAI bounds them
GREEDY_BELOW = 1e-5        # temperatures under this are greedy, as vLLM's _SAMPLING_EPS makes them


class SamplingError(ValueError):
    """A sampling parameter outside its valid range (the message names the parameter)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    Attributes:
        temperature: 0 (or under GREEDY_BELOW) for greedy; otherwise logits are divided by it (t <= 2).
        top_p: Nucleus filtering, 0 < top_p <= 1.
        top_k: Keep the k most likely tokens; 0 disables.
        seed: Seed of this request's random generator (None: nondeterministic), a 64-bit signed
            integer; negative seeds are taken modulo 2**64.
        max_tokens: Generated tokens at most (>= 1).
        stop: Strings that end generation; the text is cut before them.
        stop_token_ids: Token ids that end generation (in addition to the model's end tokens).
        ignore_eos: Keep generating past the model's end-of-turn token.
        logprobs: Report each generated token's log-probability with this many top alternatives
            (0 to 20); None reports none.
        presence_penalty: OpenAI's: subtracted once from the logit of every token already generated,
            in [-2, 2].
        frequency_penalty: OpenAI's: subtracted per occurrence of a token already generated, in [-2, 2].
        repetition_penalty: vLLM's (> 0): logits of tokens in the prompt or output are divided by it
            when positive, multiplied when negative; 1 disables.
        min_p: Drop tokens whose probability is under min_p times the most likely one's, in [0, 1].
        logit_bias: (token id, bias in [-100, 100]) pairs added to the logits; a dict is accepted.
        n: Sequences to generate from the prompt (1 to 8); sequence i draws with seed + i.
        prompt_logprobs: Report the prompt tokens' log-probabilities with this many alternatives (the
            first prompt token has none), as `echo` with `logprobs` asks; None reports none.
        grammar: Constrain the output to a grammar (JSON, a JSON schema, tool calls); None is free.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    n: int = 1
    prompt_logprobs: int | None = None
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                     "min_p"):
            if not _is_number(getattr(self, name)):
                raise SamplingError(name, f"{name} must be a number, got {getattr(self, name)!r}")
        for name in ("top_k", "max_tokens", "seed", "logprobs", "n", "prompt_logprobs"):
            value = getattr(self, name)
            if not (_is_int(value) or (value is None and name in ("seed", "logprobs", "prompt_logprobs"))):
                raise SamplingError(name, f"{name} must be an integer, got {value!r}")
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) for s in self.stop):
            raise SamplingError("stop", "stop takes a string or a list of strings")
        if not isinstance(self.stop_token_ids, tuple) or not all(_is_int(t) for t in self.stop_token_ids):
            raise SamplingError("stop_token_ids", "stop_token_ids takes a list of integers")
        if not isinstance(self.ignore_eos, bool):
            raise SamplingError("ignore_eos", f"ignore_eos must be a boolean, got {self.ignore_eos!r}")
        if self.seed is not None and not (SEED_MIN <= self.seed <= SEED_MAX):
            raise SamplingError("seed", f"seed must be a 64-bit signed integer, got {self.seed}")
        if not (0.0 <= self.temperature <= 2.0):
            raise SamplingError("temperature", f"temperature must be in [0, 2], got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise SamplingError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SamplingError("top_k", f"top_k must be >= 0, got {self.top_k}")
        if self.max_tokens < (0 if self.prompt_logprobs is not None else 1):
            raise SamplingError("max_tokens", f"max_tokens must be >= 1 (0 only with echo), got {self.max_tokens}")
        if len(self.stop) > 4 or any(not s for s in self.stop):
            raise SamplingError("stop", "stop takes up to 4 non-empty strings")
        if self.logprobs is not None and not (0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise SamplingError("top_logprobs", f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None and not (0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS):
            raise SamplingError("logprobs", f"prompt logprobs must be in [0, {MAX_TOP_LOGPROBS}], "
                                            f"got {self.prompt_logprobs}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (PENALTY_RANGE[0] <= getattr(self, name) <= PENALTY_RANGE[1]):
                raise SamplingError(name, f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not self.repetition_penalty > 0 or self.repetition_penalty == float("inf"):
            raise SamplingError("repetition_penalty", f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not (0.0 <= self.min_p <= 1.0):
            raise SamplingError("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        if not (1 <= self.n <= MAX_N):
            raise SamplingError("n", f"n must be in [1, {MAX_N}], got {self.n}")
        if not isinstance(self.logit_bias, tuple) or not all(
                isinstance(p, tuple) and len(p) == 2 and _is_int(p[0]) and p[0] >= 0 and _is_number(p[1])
                and BIAS_RANGE[0] <= p[1] <= BIAS_RANGE[1] for p in self.logit_bias):
            raise SamplingError("logit_bias", "logit_bias maps token ids (>= 0) to biases in [-100, 100]")
        if self.grammar is not None and not isinstance(self.grammar, Grammar):
            raise SamplingError("response_format", f"grammar must be a Grammar, got {self.grammar!r}")

    @property
    def penalized(self) -> bool:
        """Whether any logit_bias or penalty changes the logits (the batched processor skips the rest)."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0 \
            or self.repetition_penalty != 1

    @property
    def greedy(self) -> bool:
        """Temperatures under GREEDY_BELOW pick the argmax: dividing logits by 1e-300 overflows to inf."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1


class Sampler:
    """Draws one token per sequence from its logits, each sequence with its own generator."""

    def __init__(self, params: SamplingParams, index: int = 0) -> None:
        self.params = params
        # A negative seed is taken modulo 2**64, as torch's manual_seed (and so vLLM) takes it:
        # -1 is one fixed seed, not "random". Sequence `index` of an n > 1 request draws with seed + index.
        self.rng = np.random.default_rng(None if params.seed is None else (params.seed + index) % 2**64)

    def sample(self, logits: np.ndarray) -> int:
        """Picks the next token from one row of logits [vocab].

        The draw is numpy's `Generator.choice(vocab, p=probs)` (one uniform double against the cumulative
        probabilities; the same token up to rounding in the last bit of a sum), computed over the tokens
        that survive the filters only: masked (-inf) tokens and those top_k drops leave first, and top_p
        sorts just the most likely tokens it needs, not the whole vocabulary.
        """
        p = self.params
        if p.greedy:
            return int(np.argmax(logits))
        z = logits.astype(np.float64) / p.temperature
        top = z.max()  # NaN if any logit is NaN
        if not np.isfinite(top):
            raise ValueError("no token can be drawn: every logit is -inf" if top == -np.inf else
                             f"the logits hold {'NaN' if np.isnan(top) else '+inf'}")
        ids = None  # the surviving token ids, ascending; None while every token survives
        if p.top_k and p.top_k < z.size:
            ids = np.flatnonzero(z >= np.partition(z, -p.top_k)[-p.top_k])
        elif not (z > -np.inf).all():  # a grammar's mask made -inf logits
            ids = np.flatnonzero(z > -np.inf)
        if ids is not None:
            z = z[ids]
        z = z - top  # the most likely token survives every filter
        probs = np.exp(z)
        probs /= probs.sum()
        if p.top_p < 1.0:
            ids, probs = _narrow(ids, probs, nucleus(probs, p.top_p))
        if p.min_p > 0.0:
            ids, probs = _narrow(ids, probs, np.flatnonzero(probs >= p.min_p * probs.max()))
        cdf = np.cumsum(probs)
        cdf /= cdf[-1]
        j = int(cdf.searchsorted(self.rng.random(), side="right"))
        return j if ids is None else int(ids[j])


def _narrow(ids: np.ndarray | None, probs: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The surviving ids and their renormalized probabilities after keeping positions `keep` (ascending)."""
    probs = probs[keep]
    return (keep if ids is None else ids[keep]), probs / probs.sum()


# How many of the most likely tokens top_p looks at, round by round, before all of them: a peaked
# distribution's nucleus holds a few tokens, a flat one's thousands.
NUCLEUS_ROUNDS = (64, 1024, 8192)


def nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """The ids of the smallest set of most likely tokens whose probability reaches top_p, ascending.

    The same set as cutting a stable descending sort of all of `probs` where its running sum reaches
    top_p (of the tokens tied at the cut, the lower ids), but for tokens of probability 0, which are
    never drawn. Only values are sorted, and only those of the most likely candidates: a descending
    run of values is the same whichever way ties are ordered, so its running sums are the full sort's.

    Args:
        probs: [vocab] probabilities.
        top_p: In (0, 1).

    Returns:
        [kept] int64 token ids, ascending.
    """
    n = probs.size
    for m in (*NUCLEUS_ROUNDS, n):
        v_m = probs[np.argpartition(probs, n - m)[n - m]] if m < n else 0.0
        last = v_m <= 0.0  # only zeros below the m-th: the non-zero tokens hold all the mass
        cand = np.flatnonzero(probs > 0.0) if last else np.flatnonzero(probs >= v_m)
        vals = np.sort(probs[cand])[::-1]
        cum = np.cumsum(vals)
        if cum[-1] >= top_p or last:
            k = min(int(np.searchsorted(cum, top_p)) + 1, vals.size)
            v = vals[k - 1]                      # the least likely token kept
            pc = probs[cand]
            keep = pc > v
            keep[np.flatnonzero(pc == v)[: k - int(keep.sum())]] = True  # of the ties at v, the lowest ids
            return cand[keep]
    raise AssertionError("unreachable: the last round takes every non-zero token")


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bias_pairs(bias: dict) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs; keys may be ints or digit strings (JSON keys)."""
    pairs = []
    for key, value in bias.items():
        if isinstance(key, str) and key.strip().lstrip("-").isdigit():
            key = int(key)
        if not _is_int(key):
            raise SamplingError("logit_bias", f"logit_bias keys must be token ids, got {key!r}")
        pairs.append((key, value))
    return tuple(sorted(pairs, key=lambda kv: kv[0]))


def stop_ids_for(params: SamplingParams, model_eos: Sequence[int]) -> frozenset[int]:
    """Token ids that end a request: its stop_token_ids plus the model's end tokens unless ignored."""
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids.update(model_eos)
    return frozenset(ids)
