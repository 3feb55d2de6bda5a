"""Continuous batching: which requests run in the next step, and with how many tokens each.

Every step decodes one token for every running request that finished its prompt, then spends the rest
of a per-step token budget on prompts (chunked, first come first served), admitting waiting requests
while the batch and the KV cache have room.

KV pages are taken as a sequence grows, not for its whole max_tokens up front (vLLM's policy): a
request is admitted when its prompt fits, and each decode step claims the page its next token needs.
When the cache cannot hold every running request's next token, the newest running requests are
preempted, oldest first keeps going: a preempted request gives its pages back and waits at the head of
the queue; when readmitted it recomputes its prompt and output so far as one prefill (with prefix
caching, mostly from cached pages) and goes on where it stopped. `fits_ever` guarantees that the oldest
request, alone, always fits, so every request finishes. With prefix caching a prompt's cached pages are
shared and its cached tokens skipped (`note_cached`); pages are counted per request, shared or not, so
sharing never overcommits.
Pure Python: testable without a model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pipelines.request import Request, RequestState

# Requests decoded together by default: on 2 CPU cores SmolLM2's decode throughput keeps rising up to
# ~32 sequences per step while a step stays well under 100 ms.
DEFAULT_CPU_BATCH = 32


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one engine.

    Attributes:
        max_batch_size: Requests running at once.
        max_step_tokens: New tokens per step (prefill chunks plus one per decoding request).
        total_pages: KV cache pages in all.
        page_size: Tokens per page.
        max_seq_len: Prompt plus generated tokens of one request at most.
    """

    max_batch_size: int
    max_step_tokens: int
    total_pages: int
    page_size: int
    max_seq_len: int

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_step_tokens", "total_pages", "page_size", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_step_tokens < self.max_batch_size:
            raise ValueError("max_step_tokens must cover one token per running request")

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)


@dataclass(frozen=True)
class StepEntry:
    """One request's share of a step: `tokens` new tokens; `samples` if a token is drawn after it."""

    request: Request
    tokens: int
    samples: bool


@dataclass(frozen=True)
class Schedule:
    """The next step: what runs, and the requests preempted to make room (their pages must be freed
    before the step runs; they wait at the head of the queue)."""

    entries: list[StepEntry]
    preempted: list[Request]


class Scheduler:
    """Holds the waiting queue, the running set (in admission order) and each running request's pages."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.held: dict[str, int] = {}  # request id -> KV pages counted for it
        self.cached_tokens = 0  # prompt tokens whose KV pages came from the prefix cache, since start
        self.preemptions = 0

    @property
    def reserved_pages(self) -> int:
        """KV pages the running requests hold or are about to write this step."""
        return sum(self.held.values())

    def fits_ever(self, request: Request) -> bool:
        """Whether the request could run on an empty cache at all."""
        c = self.config
        return request.max_total_tokens <= c.max_seq_len and c.pages_for(request.max_total_tokens) <= c.total_pages

    def add(self, request: Request) -> None:
        if not self.fits_ever(request):
            raise ValueError(f"request {request.request_id} needs {request.max_total_tokens} tokens, "
                             f"more than one sequence may hold ({self.config.max_seq_len})")
        self.waiting.append(request)

    def schedule(self) -> Schedule:
        """Plans the next step (and moves admitted requests to running, preempted ones to waiting)."""
        c = self.config
        preempted = self._grow()
        budget = c.max_step_tokens
        plan: list[StepEntry] = []
        for req in self.running:
            if not req.in_prefill:
                plan.append(StepEntry(req, 1, True))
                budget -= 1
        for req in self.running:
            if req.in_prefill and budget > 0:
                n = min(budget, req.prefill_length - req.prefilled)
                plan.append(StepEntry(req, n, req.prefilled + n == req.prefill_length))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < c.max_batch_size:
            req = self.waiting[0]
            # Room for the prompt and the first token's page: a request admitted into a full cache
            # would only be preempted at its first decode step.
            first = min(req.prefill_length + 1, req.max_total_tokens)  # echo with max_tokens 0 adds none
            if self.reserved_pages + c.pages_for(first) > c.total_pages:
                break  # head of line waits for pages; FCFS keeps long requests from starving
            self.waiting.popleft()
            self.held[req.request_id] = c.pages_for(req.prefill_length)
            req.state = RequestState.RUNNING
            self.running.append(req)
            n = min(budget, req.prefill_length)
            plan.append(StepEntry(req, n, n == req.prefill_length))
            budget -= n
        return Schedule(plan, preempted)

    def _grow(self) -> list[Request]:
        """Counts the page each decoding request's next token needs, oldest first; while the cache
        cannot hold it, preempts the newest running request (possibly this one). Returns the preempted."""
        c = self.config
        preempted: list[Request] = []
        i = 0
        while i < len(self.running):
            req = self.running[i]
            need = c.pages_for(req.context_length) - self.held[req.request_id]
            while need > 0 and self.reserved_pages + need > c.total_pages:
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req.state is RequestState.RUNNING:
                self.held[req.request_id] += max(0, need)
            i += 1
        return preempted

    def _preempt(self, req: Request) -> None:
        """Moves a running request to the head of the queue; its next prefill recomputes what it holds."""
        self.running.remove(req)
        del self.held[req.request_id]
        req.state = RequestState.WAITING
        req.prefilled = 0
        req.recomputed = len(req.output_ids)
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def note_cached(self, entry: StepEntry, cached: int, active: int) -> StepEntry:
        """Counts prompt tokens found in the prefix cache while preparing `entry`; returns the entry that
        really runs: `active` new tokens after the `cached` ones, sampling if they end the prompt."""
        req = entry.request
        req.prefilled += cached
        if not req.output_ids:  # a recompute's reuse is not the client's prompt caching
            req.cached_tokens += cached
            self.cached_tokens += cached
        return StepEntry(req, active, req.prefilled + active == req.prefill_length)

    def finish(self, request: Request) -> None:
        """Removes a running or waiting request and returns its reservation."""
        if request.request_id in self.held:
            self.running.remove(request)
            del self.held[request.request_id]
        elif request in self.waiting:
            self.waiting.remove(request)
        request.state = RequestState.FINISHED

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
