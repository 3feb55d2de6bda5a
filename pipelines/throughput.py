"""Batch-1 throughput of the engine that serves: one request's prefill and decode rates.

`bench e2e` and `crucible qualify` time the same LLMEngine that `crucible serve` runs (scheduler, model
runner, sampler, detokenizer), so a record's tok/s is what one chat stream gets minus HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from crucible.core.tokenizer import encode_prompt
from pipelines.engine import EngineConfig, LLMEngine
from pipelines.sampling import SamplingParams

FILLER = ("The river runs past the old mill and the children walk along the bank to school each morning, "
          "counting the boats and the birds and telling each other stories about the town. ")


@dataclass(frozen=True)
class Batch1Timing:
    """One timed request.

    Attributes:
        prompt_tokens: Prompt length.
        generated: Tokens generated.
        prefill_tok_s: Prompt tokens per second up to the first generated token.
        decode_tok_s: Generated tokens per second after the first.
    """

    prompt_tokens: int
    generated: int
    prefill_tok_s: float
    decode_tok_s: float


def batch1_engine(model, tokenizer, prompt_tokens: int) -> LLMEngine:
    """An engine for one request at a time whose prompt prefills in one step, as in serving."""
    return LLMEngine(EngineConfig(model=str(model.source.path), max_batch_size=1,
                                  max_step_tokens=max(512, prompt_tokens)), model=model, tokenizer=tokenizer)


def time_batch1(engine: LLMEngine, prompt_ids: Sequence[int], gen_tokens: int) -> Batch1Timing:
    """Runs one greedy request of exactly `gen_tokens` tokens through the engine and times its steps."""
    times: list[float] = []
    start = time.perf_counter()
    engine.submit(list(prompt_ids), SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=True))
    while engine.has_work:
        if any(out.new_token_ids for out in engine.step()):
            times.append(time.perf_counter())
    prefill = times[0] - start
    decode = times[-1] - times[0] if len(times) > 1 else float("nan")
    return Batch1Timing(len(prompt_ids), len(times), len(prompt_ids) / prefill, (len(times) - 1) / decode)


def chat_prompt_of_length(tokenizer, n_tokens: int) -> tuple[str, list[int]]:
    """A user message whose chat-templated prompt is as close to n_tokens as possible (not above)."""
    words = (FILLER * (n_tokens // 8 + 2)).split()
    lo, hi = 1, len(words)
    while lo < hi:  # the longest prefix of words whose templated prompt fits
        mid = (lo + hi + 1) // 2
        if len(encode_prompt(tokenizer, " ".join(words[:mid]) + " Now continue the story.")) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo]) + " Now continue the story."
    return text, encode_prompt(tokenizer, text)
