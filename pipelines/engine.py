"""The generation engine: continuous batching of requests over one model runner (graphs/runner.py).

One `step()` reads as: schedule (scheduler.py) -> prepare and execute the ragged batch on the runner ->
postprocess each sequence (sample, detokenize, stop) -> release finished requests' pages.
The engine is single-threaded; `serve/` drives it from one background thread and talks to it through
`submit`, `abort` and `load`, which are safe to call from other threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from crucible.core.registry import DEFAULT_MODEL
from graphs.model import CrucibleModel, ModelOptions
from graphs.runner import ModelRunner
from pipelines.detokenizer import IncrementalDetokenizer
from pipelines.logprobs import TokenLogprob, token_logprob
from pipelines.request import Request, RequestOutput, RequestState
from pipelines.sampling import Sampler, SamplingParams, stop_ids_for
from pipelines.scheduler import DEFAULT_CPU_BATCH, Scheduler, SchedulerConfig, StepEntry

log = logging.getLogger("crucible.engine")


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings.

    Attributes:
        model: Registry name, .gguf file or HF folder.
        device: "cpu" or "gpu".
        max_batch_size: Requests decoded together (MAX's CPU planner would default to 1).
        max_step_tokens: New tokens per step; long prompts are prefilled in chunks of at most this.
        kv_cache_gib: Memory for the paged KV cache.
        max_seq_len: Prompt + completion limit per request (None: the model's context length).
        activations: "f32" or "q8" (int8 activations in the CPU decode matmuls; ModelOptions).
    """

    model: str = DEFAULT_MODEL
    device: str = "cpu"
    max_batch_size: int = DEFAULT_CPU_BATCH
    max_step_tokens: int = 512
    kv_cache_gib: float = 1.0
    max_seq_len: int | None = None
    activations: str = "f32"

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_step_tokens < self.max_batch_size:
            raise ValueError("need max_batch_size >= 1 and max_step_tokens >= max_batch_size")
        if self.kv_cache_gib <= 0:
            raise ValueError("kv_cache_gib must be positive")


class ContextLengthError(ValueError):
    """A request that can never fit: its prompt, or prompt plus max_tokens, exceeds the context or cache.

    Attributes:
        prompt_tokens: The prompt's length.
        limit: Tokens one sequence may hold.
        prompt_alone: Whether the prompt by itself is too long (else max_tokens makes it so).
    """

    def __init__(self, message: str, prompt_tokens: int, limit: int, prompt_alone: bool) -> None:
        super().__init__(message)
        self.prompt_tokens, self.limit, self.prompt_alone = prompt_tokens, limit, prompt_alone


@dataclass(frozen=True)
class EngineLoad:
    """The engine's state after its last step, safe to read from any thread.

    Attributes:
        waiting: Requests submitted or queued, not yet running.
        running: Requests holding KV pages.
        pages_used: KV pages in use.
        pages_total: KV pages in all.
    """

    waiting: int = 0
    running: int = 0
    pages_used: int = 0
    pages_total: int = 0


class LLMEngine:
    """Owns the model, tokenizer, KV cache manager and scheduler.

    Args:
        config: Settings.
        model: An already compiled model to reuse (its source wins over config.model).
        tokenizer: Its tokenizer (loaded from the model source if omitted).
    """

    def __init__(self, config: EngineConfig, model: CrucibleModel | None = None, tokenizer=None) -> None:
        from crucible.core.tokenizer import load_tokenizer

        self.config = config
        self.model = model or CrucibleModel(config.model, ModelOptions(device=config.device,
                                                                         activations=config.activations))
        self.tokenizer = tokenizer or load_tokenizer(self.model.source)
        cfg = self.model.config
        self.runner = ModelRunner.for_memory(self.model, config.kv_cache_gib, config.max_batch_size)
        max_seq = min(config.max_seq_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.scheduler = Scheduler(SchedulerConfig(
            max_batch_size=config.max_batch_size, max_step_tokens=config.max_step_tokens,
            total_pages=self.runner.pages_total(), page_size=self.runner.page_size, max_seq_len=max_seq))
        self._lock = threading.Lock()
        self._load = EngineLoad(pages_total=self.runner.pages_total())  # until the first step publishes
        self._pending: list[Request] = []
        self._aborts: set[str] = set()
        self._live: dict[str, _Live] = {}
        self.eos_ids = tuple(cfg.eos_token_ids)
        self.stats = EngineStats()

    # -- thread-safe entry points -------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None) -> Request:
        """Queues a request, validated now (nothing is queued when it fails).

        Raises:
            ContextLengthError: The prompt, or prompt plus max_tokens, can never fit.
            ValueError: An empty prompt or a token id outside the vocabulary.
        """
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if max(prompt_ids) >= self.model.config.vocab_size or min(prompt_ids) < 0:
            raise ValueError("prompt token id outside the vocabulary")
        req = Request(list(prompt_ids), params) if request_id is None else Request(list(prompt_ids), params, request_id)
        limit = self.max_seq_len
        if len(prompt_ids) >= limit:
            raise ContextLengthError(f"the prompt has {len(prompt_ids)} tokens; the context limit is {limit} "
                                     "tokens", len(prompt_ids), limit, True)
        if not self.scheduler.fits_ever(req):
            raise ContextLengthError(
                f"prompt of {len(prompt_ids)} tokens plus max_tokens={params.max_tokens} exceeds the "
                f"context limit of {limit} tokens", len(prompt_ids), limit, False)
        with self._lock:
            self._pending.append(req)
        return req

    def abort(self, request_id: str) -> None:
        """Stops a request at the next step and frees its KV pages."""
        with self._lock:
            self._aborts.add(request_id)

    # -- the step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Runs one batch step and returns every request's new output (finished ones included).

        A failure while admitting, preparing, executing, sampling or detokenizing one request finishes
        that request alone with finish_reason "error" (its pages released); the others go on.
        """
        outputs = self._admit_and_abort()
        plan = self.scheduler.schedule()
        if plan:
            plan, failed = self._prepare(plan)
            rows, failed_run = self._execute(plan)
            outputs += failed + failed_run + self._postprocess(rows)
        self._publish_load()
        return outputs

    def _prepare(self, plan: list[StepEntry]) -> tuple[list[StepEntry], list[RequestOutput]]:
        """Chunks each sequence's new tokens and allocates its KV pages for the step."""
        kept, failed = [], []
        for entry in plan:
            try:
                self.runner.prepare(self._live[entry.request.request_id].seq, entry.tokens)
                kept.append(entry)
            except Exception as exc:  # noqa: BLE001
                failed.append(self._fail(entry.request, "preparing the step", exc))
        return kept, failed

    def _execute(self, plan: list[StepEntry]) -> tuple[list[tuple[StepEntry, np.ndarray]], list[RequestOutput]]:
        """Runs the step's batch; if it fails, runs each request alone so only the failing ones end.

        Returns:
            (entry, logits [vocab]) for each request that ran, and the error outputs of those that did not.
        """
        if not plan:
            return [], []
        try:
            logits = self._run(plan)
            return list(zip(plan, logits)), []
        except Exception as exc:  # noqa: BLE001
            if len(plan) == 1:
                return [], [self._fail(plan[0].request, "model execution", exc)]
        rows, failed = [], []
        for entry in plan:  # nothing was committed to the KV cache: the step can run again, one by one
            try:
                rows.append((entry, self._run([entry])[0]))
            except Exception as exc:  # noqa: BLE001
                failed.append(self._fail(entry.request, "model execution", exc))
        return rows, failed

    def _run(self, plan: list[StepEntry]) -> np.ndarray:
        """Executes the graph on the plan's prepared sequences; returns logits [len(plan), vocab]."""
        start = time.perf_counter()
        logits = self.runner.execute([self._live[entry.request.request_id].seq for entry in plan])
        self.stats.steps += 1
        self.stats.step_seconds += time.perf_counter() - start
        self.stats.prompt_tokens += sum(e.tokens for e in plan if e.request.in_prefill)
        return logits

    def _postprocess(self, rows: list[tuple[StepEntry, np.ndarray]]) -> list[RequestOutput]:
        """Advances each sequence that ran; a failure here ends that request alone."""
        outputs = []
        for entry, logits in rows:
            try:
                out = self._advance(entry, logits)
            except Exception as exc:  # noqa: BLE001 - one request's bug fails that request
                out = self._fail(entry.request, "sampling or detokenizing", exc)
            if out is not None:
                outputs.append(out)
        return outputs

    def _advance(self, entry: StepEntry, logits: np.ndarray) -> RequestOutput | None:
        """Commits one sequence's step: a prompt chunk, or sample, detokenize and check the stops."""
        req = entry.request
        live = self._live[req.request_id]
        if req.in_prefill:
            req.prefilled += entry.tokens
            if not entry.samples:
                self.runner.advance(live.seq, None)
                return None
        tok = live.sampler.sample(logits)
        lp = () if req.params.logprobs is None else (token_logprob(logits, tok, req.params.logprobs),)
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        req.output_ids.append(tok)
        self.runner.advance(live.seq, tok)
        self.stats.generated_tokens += 1
        reason = None
        if tok in live.stop_ids:
            reason = "stop"
            delta = live.detok.flush()
        else:
            res = live.detok.add(tok)
            delta = res.delta
            if res.stopped:
                reason = "stop"
            elif len(req.output_ids) >= req.params.max_tokens:
                reason = "length"
                delta += live.detok.flush()
        if reason:
            return self._finish(req, reason, delta=delta, new=(tok,), logprobs=lp)
        return RequestOutput(req.request_id, (tok,), delta, False, None, len(req.prompt_ids),
                             len(req.output_ids), logprobs=lp)

    def _admit_and_abort(self) -> list[RequestOutput]:
        with self._lock:
            pending, self._pending = self._pending, []
            aborts, self._aborts = self._aborts, set()
        outputs = []
        for req in pending:
            if req.request_id in aborts:  # aborted before it was admitted: it holds nothing yet
                outputs.append(self._finish(req, "abort"))
                continue
            try:
                self._admit(req)
            except Exception as exc:  # noqa: BLE001
                outputs.append(self._fail(req, "admission", exc))
        for rid in aborts:
            req = next((r for r in [*self.scheduler.running, *self.scheduler.waiting] if r.request_id == rid), None)
            if req is not None:
                outputs.append(self._finish(req, "abort"))
        return outputs

    def _admit(self, req: Request) -> None:
        """Gives a submitted request its sampler, detokenizer and cache slot, and queues it."""
        sampler = Sampler(req.params)
        detok = IncrementalDetokenizer(self._decode, req.params.stop)
        seq = self.runner.start(req.prompt_ids, req.max_total_tokens + 1)
        self._live[req.request_id] = _Live(seq, sampler, detok, stop_ids_for(req.params, self.eos_ids))
        self.scheduler.add(req)  # from here on, _finish releases the slot

    def _fail(self, req: Request, stage: str, exc: Exception) -> RequestOutput:
        """Ends one request with an error (a server bug: logged with its id and traceback)."""
        log.error("request %s failed in %s: %r", req.request_id, stage, exc, exc_info=exc)
        return self._finish(req, "error", error=f"internal error in {stage}: {exc}")

    def _finish(self, req: Request, reason: str, delta: str = "", new: tuple[int, ...] = (),
                error: str | None = None, logprobs: tuple[TokenLogprob, ...] = ()) -> RequestOutput:
        live = self._live.pop(req.request_id, None)
        self.scheduler.finish(req)
        if live is not None:
            try:
                self.runner.release(live.seq)
            except Exception as exc:  # noqa: BLE001 - the request ends either way
                log.error("request %s: releasing its KV pages failed: %r", req.request_id, exc, exc_info=exc)
        req.finish_reason, req.error, req.finish_time = reason, error, time.perf_counter()
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        return RequestOutput(req.request_id, new, delta, True, reason, len(req.prompt_ids),
                             len(req.output_ids), error, logprobs)

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # -- introspection ----------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        with self._lock:
            pending = bool(self._pending or self._aborts)
        return pending or self.scheduler.has_work

    @property
    def max_seq_len(self) -> int:
        """Tokens one request may hold: prompt plus completion."""
        return self.scheduler.config.max_seq_len

    def kv_pages_in_use(self) -> int:
        """KV pages MAX's cache manager reports in use (0 when no request holds any); engine thread only."""
        return self.runner.pages_used()

    def kv_pages_total(self) -> int:
        return self.runner.pages_total()

    def load(self) -> EngineLoad:
        """Queue, running set and cache use as of the last step (any thread)."""
        with self._lock:
            return replace(self._load, waiting=self._load.waiting + len(self._pending))

    def _publish_load(self) -> None:
        load = EngineLoad(len(self.scheduler.waiting), len(self.scheduler.running), self.runner.pages_used(),
                          self.runner.pages_total())
        with self._lock:
            self._load = load


@dataclass
class _Live:
    seq: object  # the runner's sequence (MAX's TextContext)
    sampler: Sampler
    detok: IncrementalDetokenizer
    stop_ids: frozenset[int]


@dataclass
class EngineStats:
    """Counters since the engine started."""

    steps: int = 0
    step_seconds: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> count

