"""A generation request as the engine tracks it, and the output records it produces."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from pipelines.logprobs import TokenLogprob
from pipelines.sampling import SamplingParams

_ids = itertools.count()


class RequestState(Enum):
    WAITING = "waiting"      # queued (or preempted), holds no KV pages
    RUNNING = "running"      # holds its pages; prefilling or decoding
    FINISHED = "finished"    # pages released


FinishReason = str  # "stop" (end token or stop string), "length", "abort", "error"


@dataclass(eq=False)  # identity: the scheduler's lists hold each request once
class Request:
    """One sequence to generate.

    Attributes:
        request_id: Unique id (caller's or generated).
        prompt_ids: Prompt token ids.
        params: Sampling and stopping.
        state: Lifecycle state.
        prefilled: Tokens of the current prefill already written to the KV cache.
        output_ids: Generated token ids.
        finish_reason: Set when finished.
        arrival: perf_counter time of submission.
        first_token_time: perf_counter time of the first generated token.
        index: Which of the request's n sequences this is (0 to n - 1).
        leader: The sibling sequence whose prompt pages this one waits for and reuses (n > 1).
        cached_tokens: Prompt tokens whose KV pages came from the prefix cache.
        recomputed: Generated tokens fed back as prompt after the last preemption: the prefill then
            covers the prompt and these, and the first token sampled after it continues the output.
        preemptions: Times the request gave its pages back to let older requests grow.
    """

    prompt_ids: list[int]
    params: SamplingParams
    request_id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    state: RequestState = RequestState.WAITING
    prefilled: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: str | None = None
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    index: int = 0
    leader: Request | None = None
    cached_tokens: int = 0
    recomputed: int = 0
    preemptions: int = 0

    @property
    def max_total_tokens(self) -> int:
        """Tokens this request may hold in the cache: the prompt plus every token it may generate."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def prefill_ids(self) -> list[int]:
        """The tokens the current prefill writes: the prompt, and after a preemption the output so far."""
        return self.prompt_ids + self.output_ids[:self.recomputed]

    @property
    def prefill_length(self) -> int:
        return len(self.prompt_ids) + self.recomputed

    @property
    def context_length(self) -> int:
        """Tokens the sequence holds once its pending token is written: prompt plus output so far."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_length


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request.

    Attributes:
        request_id: The request.
        new_token_ids: Tokens generated this step (0 or 1).
        text_delta: Text released this step.
        finished: The request is done.
        finish_reason: Why it finished.
        prompt_tokens: Prompt length.
        completion_tokens: Tokens generated so far.
        error: Message when finish_reason is "error".
        logprobs: The new tokens' log-probabilities when the request asked for them.
        prompt_logprobs: The prompt tokens' log-probabilities (None for the first), once, on the output
            that ends the prompt, when the request asked for them.
        cached_tokens: Prompt tokens reused from the prefix cache.
        index: Which of the request's n sequences this is.
    """

    request_id: str
    new_token_ids: tuple[int, ...]
    text_delta: str
    finished: bool
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()
    cached_tokens: int = 0
    index: int = 0
