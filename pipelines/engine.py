"""The generation engine: continuous batching of requests over one CrucibleModel and MAX's paged KV cache.

One `step()` reads as: schedule (scheduler.py) -> run the ragged batch through the graph -> sample each
sequence that finished its prompt -> detokenize and check stops -> release finished requests' pages.
The engine is single-threaded; `serve/` drives it from one background thread and talks to it through
`submit`/`abort`, which are safe to call from other threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graphs.generate import make_step_batch
from graphs.model import CrucibleModel, ModelOptions
from pipelines.detokenizer import IncrementalDetokenizer
from pipelines.logprobs import TokenLogprob, token_logprob
from pipelines.request import Request, RequestOutput, RequestState
from pipelines.sampling import Sampler, SamplingParams, stop_ids_for
from pipelines.scheduler import Scheduler, SchedulerConfig, StepEntry

log = logging.getLogger("crucible.engine")

# Measured on the 2-core dev machine with SmolLM2: decode throughput keeps rising up to ~32 sequences
# per step while a step stays well under 100 ms (benchmarks/serve numbers in the serve issue's note).
DEFAULT_CPU_BATCH = 32


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

    model: str = "smollm2-135m"
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


class LLMEngine:
    """Owns the model, tokenizer, KV cache manager and scheduler.

    Args:
        config: Settings.
        model: An already compiled model to reuse (its source wins over config.model).
        tokenizer: Its tokenizer (loaded from the model source if omitted).
    """

    def __init__(self, config: EngineConfig, model: CrucibleModel | None = None, tokenizer=None) -> None:
        from max.pipelines.kv_cache import PagedKVCacheManager

        from crucible.tokenizer import load_tokenizer

        self.config = config
        self.model = model or CrucibleModel(config.model, ModelOptions(device=config.device,
                                                                         activations=config.activations))
        self.tokenizer = tokenizer or load_tokenizer(self.model.source)
        cfg = self.model.config
        page = self.model.options.page_size
        page_bytes = 2 * cfg.num_layers * page * cfg.num_kv_heads * cfg.head_dim * 4
        total_pages = max(1, int(config.kv_cache_gib * 2**30 // page_bytes))
        max_seq = min(config.max_seq_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.scheduler = Scheduler(SchedulerConfig(
            max_batch_size=config.max_batch_size, max_step_tokens=config.max_step_tokens,
            total_pages=total_pages, page_size=page, max_seq_len=max_seq))
        self.kv = PagedKVCacheManager(params=self.model.kv_params, session=self.model.session,
                                      total_num_pages=total_pages, max_batch_size=config.max_batch_size)
        self._lock = threading.Lock()
        self._pending: list[Request] = []
        self._aborts: set[str] = set()
        self._live: dict[str, _Live] = {}
        self.eos_ids = tuple(cfg.eos_token_ids)
        self.stats = EngineStats()

    # -- thread-safe entry points -------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None) -> Request:
        """Queues a request (validated now: too long raises ValueError, nothing is queued)."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if max(prompt_ids) >= self.model.config.vocab_size or min(prompt_ids) < 0:
            raise ValueError("prompt token id outside the vocabulary")
        req = Request(list(prompt_ids), params) if request_id is None else Request(list(prompt_ids), params, request_id)
        if not self.scheduler.fits_ever(req):
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens plus max_tokens={params.max_tokens} exceeds the "
                f"context limit of {self.scheduler.config.max_seq_len} tokens")
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
        if not plan:
            return outputs
        plan, failed = self._prepare(plan)
        outputs += failed
        rows, failed = self._execute(plan)
        outputs += failed
        for entry, logits in rows:
            try:
                out = self._advance(entry, logits)
            except Exception as exc:  # noqa: BLE001 - one request's bug fails that request
                out = self._fail(entry.request, "sampling or detokenizing", exc)
            if out is not None:
                outputs.append(out)
        return outputs

    def _prepare(self, plan: list[StepEntry]) -> tuple[list[StepEntry], list[RequestOutput]]:
        """Chunks each sequence's new tokens and allocates its KV pages for the step."""
        kept, failed = [], []
        for entry in plan:
            try:
                ctx = self._live[entry.request.request_id].ctx
                if entry.tokens < ctx.tokens.active_length:
                    ctx.tokens.chunk(entry.tokens)
                self.kv.alloc(ctx)
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
        """Executes the graph on the plan's sequences; returns logits [len(plan), vocab]."""
        from max import tree

        ctxs = [self._live[entry.request.request_id].ctx for entry in plan]
        kv = tree.flatten(self.kv.runtime_inputs([ctxs]))[0]
        batch = make_step_batch([np.asarray(c.tokens.active, dtype=np.int64) for c in ctxs])
        start = time.perf_counter()
        logits = self.model.execute(batch.tokens, batch.row_offsets, batch.logit_rows, kv)
        self.stats.steps += 1
        self.stats.step_seconds += time.perf_counter() - start
        self.stats.prompt_tokens += sum(e.tokens for e in plan if e.request.in_prefill)
        return logits

    def _advance(self, entry: StepEntry, logits: np.ndarray) -> RequestOutput | None:
        """Commits one sequence's step: KV bookkeeping, then (after its prompt) sample, detokenize, stop."""
        req = entry.request
        live = self._live[req.request_id]
        if req.in_prefill:
            req.prefilled += entry.tokens
            if not entry.samples:
                live.ctx.tokens.advance_chunk()
                self.kv.step(live.ctx)
                return None
        tok = live.sampler.sample(logits)
        lp = () if req.params.logprobs is None else (token_logprob(logits, tok, req.params.logprobs),)
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        req.output_ids.append(tok)
        live.ctx.update(tok)
        self.kv.step(live.ctx)
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
        """Gives a submitted request its sampler, detokenizer and KV context, and queues it."""
        from max.pipelines.context import TextContext, TokenBuffer

        ctx = TextContext(request_id=_request_id(), max_length=req.max_total_tokens + 1,
                          tokens=TokenBuffer(np.asarray(req.prompt_ids, dtype=np.int64)))
        live = _Live(ctx, Sampler(req.params), IncrementalDetokenizer(self._decode, req.params.stop),
                     stop_ids_for(req.params, self.eos_ids))
        self.kv.claim(ctx)
        self._live[req.request_id] = live  # from here on, _finish releases the claim
        self.scheduler.add(req)

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
                self.kv.release(live.ctx)
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

    def kv_pages_in_use(self) -> int:
        """KV pages MAX's cache manager reports in use (0 when no request holds any)."""
        return self.kv.block_count().used

    def kv_pages_total(self) -> int:
        return self.kv.block_count().total

    def queue_depth(self) -> int:
        with self._lock:
            return len(self._pending) + len(self.scheduler.waiting)


@dataclass
class _Live:
    ctx: object
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


def _request_id():
    from max.pipelines.modeling.types import RequestID

    return RequestID()
