"""The generation engine: continuous batching of requests over one model runner (graphs/runner.py).

One `step()` reads as: schedule (scheduler.py) -> prepare and execute the ragged batch on the runner ->
process the logits of the batch (penalties, grammar masks) -> sample, detokenize and stop each sequence
-> release finished requests' pages. A request with n > 1 is n sequences; with prefix caching on, the
siblings wait for the first to write the prompt's pages and then reuse them.
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

from graphs.model import CrucibleModel, ModelOptions
from graphs.runner import ModelRunner
from pipelines.detokenizer import IncrementalDetokenizer
from pipelines.engine_types import ContextLengthError, EngineConfig, EngineLoad, EngineStats
from pipelines.grammar import GrammarCompiler, GrammarMatcher
from pipelines.logits_processors import process_logits
from pipelines.logprobs import TokenLogprob, chunk_prompt_logprobs, token_logprob
from pipelines.request import Request, RequestOutput, RequestState
from pipelines.sampling import Sampler, SamplingError, SamplingParams, stop_ids_for
from pipelines.tools import special_tag_ids
from pipelines.scheduler import Scheduler, SchedulerConfig, StepEntry

__all__ = ["ContextLengthError", "EngineConfig", "EngineLoad", "EngineStats", "LLMEngine"]

log = logging.getLogger("crucible.engine")


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
        self.model = model or CrucibleModel(config.model, ModelOptions(
            device=config.device, activations=config.activations, dtype=config.dtype))
        self.tokenizer = tokenizer or load_tokenizer(self.model.source)
        cfg = self.model.config
        self.runner = ModelRunner.for_memory(self.model, config.kv_cache_gib, config.max_batch_size,
                                             prefix_caching=config.prefix_caching)
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
        self.grammars = GrammarCompiler(self.tokenizer, cfg.vocab_size, self.eos_ids)
        # Some tokenizers (Hermes-style) make <tool_call> a special token: it must stay in the text that
        # tool calls are read from (pipelines/tools.py).
        added = getattr(self.tokenizer, "added_tokens_decoder", {})
        special = set(getattr(self.tokenizer, "all_special_ids", ())) | {i for i, t in added.items() if t.special}
        self._kept_special = set(special_tag_ids(self.tokenizer).values())
        self._skipped_special = special - self._kept_special
        self.stats = EngineStats()

    # -- thread-safe entry points -------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str | None = None) -> Request:
        """Queues a request of one sequence (n = 1); see `submit_n`."""
        if params.n != 1:
            raise ValueError("submit takes n = 1; use submit_n for n > 1")
        return self.submit_n(prompt_ids, params, request_id)[0]

    def submit_n(self, prompt_ids: Sequence[int], params: SamplingParams,
                 request_id: str | None = None) -> list[Request]:
        """Queues a request's n sequences, validated now (nothing is queued when it fails).

        Args:
            prompt_ids: The prompt's token ids.
            params: Sampling; params.n sequences are generated.
            request_id: Id of the request (generated when None); with n > 1 sequence i is "{id}-{i}".

        Returns:
            The n sequences, in order.

        Raises:
            ContextLengthError: The prompt, or prompt plus max_tokens, can never fit.
            GrammarError: The grammar (response_format, tools) cannot be compiled (a ValueError).
            ValueError: An empty prompt; SamplingError (a ValueError naming `param`): a token id outside
                the vocabulary (prompt or logit_bias).
        """
        vocab = self.model.config.vocab_size
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if max(prompt_ids) >= vocab or min(prompt_ids) < 0:
            raise SamplingError("prompt", f"prompt token id outside the vocabulary (0 to {vocab - 1})")
        if any(t >= vocab for t, _ in params.logit_bias):
            raise SamplingError("logit_bias", f"logit_bias names a token id outside the vocabulary (0 to {vocab - 1})")
        if params.grammar is not None:
            self.grammars.compile(params.grammar)  # raises GrammarError naming what is unsupported
        ids = list(prompt_ids)
        base = Request(ids, params) if request_id is None else Request(ids, params, request_id)
        limit = self.max_seq_len
        if len(prompt_ids) >= limit:
            raise ContextLengthError(f"the prompt has {len(prompt_ids)} tokens; the context limit is {limit} "
                                     "tokens", len(prompt_ids), limit, True)
        if not self.scheduler.fits_ever(base):
            raise ContextLengthError(
                f"prompt of {len(prompt_ids)} tokens plus max_tokens={params.max_tokens} exceeds the "
                f"context limit of {limit} tokens", len(prompt_ids), limit, False)
        reqs = [base] if params.n == 1 else [
            Request(list(prompt_ids), params, f"{base.request_id}-{i}", index=i) for i in range(params.n)]
        # Siblings wait for the first to write the prompt's pages only when they can reuse some: a
        # prompt of a full page or more, whose logprobs are not wanted (those are computed in full).
        if self.config.prefix_caching and params.prompt_logprobs is None and len(ids) > self.runner.page_size:
            for sibling in reqs[1:]:
                sibling.leader = reqs[0]
        with self._lock:
            self._pending.extend(reqs)
        return reqs

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
        schedule = self.scheduler.schedule()
        outputs += self._preempt(schedule.preempted)
        plan = schedule.entries
        if plan:
            plan, failed = self._prepare(plan)
            rows, failed_run = self._execute(plan)
            outputs += failed + failed_run + self._postprocess(rows)
        self._publish_load()
        return outputs

    def _preempt(self, reqs: list[Request]) -> list[RequestOutput]:
        """Frees the pages of requests the scheduler preempted and gives each a fresh sequence that holds
        its prompt and output so far, recomputed when it runs again. A request preempted before its first
        token starts over (prompt logprobs and cached-token count included)."""
        failed = []
        for req in reqs:
            live = self._live[req.request_id]
            try:
                self.runner.release(live.seq)
                live.seq = None
                if not req.output_ids:
                    live.prompt_logprobs.clear()
                    req.cached_tokens = 0
                live.seq = self.runner.start(req.prefill_ids, req.max_total_tokens + 1)
            except Exception as exc:  # noqa: BLE001
                failed.append(self._fail(req, "preemption", exc))
        return failed

    def _prepare(self, plan: list[StepEntry]) -> tuple[list[StepEntry], list[RequestOutput]]:
        """Chunks each sequence's new tokens and allocates its KV pages for the step."""
        kept, failed = [], []
        for entry in plan:
            req = entry.request
            try:
                seq = self._live[req.request_id].seq
                cached = self.runner.prepare(seq, entry.tokens, reuse_prefix=not self._every_position(req))
                if cached:
                    entry = self.scheduler.note_cached(entry, cached, seq.tokens.active_length)
                kept.append(entry)
            except Exception as exc:  # noqa: BLE001
                failed.append(self._fail(entry.request, "preparing the step", exc))
        return kept, failed

    def _execute(self, plan: list[StepEntry]) -> tuple[list[tuple[StepEntry, np.ndarray]], list[RequestOutput]]:
        """Runs the step's batch; if it fails, runs each request alone so only the failing ones end.

        Returns:
            (entry, logits) for each request that ran: [vocab] of its last new token, or [new tokens,
            vocab] for a prompt chunk whose logprobs are wanted; and the error outputs of those that did not.
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

    def _run(self, plan: list[StepEntry]) -> list[np.ndarray]:
        """Executes the graph on the plan's prepared sequences: each entry's logits (see `_execute`).

        Prompt chunks whose logprobs are wanted run alone, with the logits of every position.
        """
        start = time.perf_counter()
        every = [self._every_position(e.request) for e in plan]
        batched = [e for e, all_pos in zip(plan, every) if not all_pos]
        # When every batched row is a plain greedy pick, only the argmax ids leave the device ([B], not
        # [B, vocab]); each such row is then a 0-d int64 array (see _advance).
        ids_only = bool(batched) and all(self._plain_greedy(e) for e in batched)
        rows = iter(self.runner.execute([self._live[e.request.request_id].seq for e in batched], tokens_only=ids_only)
                    if batched else ())
        logits = [self.runner.execute([self._live[e.request.request_id].seq], all_positions=True) if all_pos
                  else next(rows) for e, all_pos in zip(plan, every)]
        self.stats.steps += 1
        self.stats.step_seconds += time.perf_counter() - start
        self.stats.prompt_tokens += sum(e.tokens for e in plan if e.request.in_prefill and not e.request.output_ids)
        return logits

    @staticmethod
    def _every_position(req: Request) -> bool:
        """Whether this step needs the logits of every new token: a first prefill whose prompt logprobs
        are wanted (computed in full, no prefix reuse). A recompute after a preemption has them already."""
        return req.in_prefill and req.params.prompt_logprobs is not None and not req.output_ids

    def _plain_greedy(self, entry: StepEntry) -> bool:
        """Whether this row needs nothing of its logits but their argmax: it does not sample yet, or it
        samples greedily with no logprobs, penalties, logit_bias or grammar."""
        params = entry.request.params
        if not entry.samples:
            return True
        return (params.greedy and params.logprobs is None and not params.penalized
                and self._live[entry.request.request_id].matcher is None)

    def _postprocess(self, rows: list[tuple[StepEntry, np.ndarray]]) -> list[RequestOutput]:
        """Processes the logits of the sequences that sample (batched), then advances each sequence that
        ran; a failure here ends that request alone."""
        outputs, last = [], []
        for entry, logits in rows:
            try:
                last.append((entry, self._note_prompt_logprobs(entry, logits) if logits.ndim == 2 else logits))
            except Exception as exc:  # noqa: BLE001
                outputs.append(self._fail(entry.request, "prompt logprobs", exc))
        processed = self._process_logits([(e, x) for e, x in last if e.samples])
        for entry, logits in last:
            try:
                out = self._advance(entry, logits, processed.get(entry.request.request_id))
            except Exception as exc:  # noqa: BLE001 - one request's bug fails that request
                out = self._fail(entry.request, "sampling or detokenizing", exc)
            if out is not None:
                outputs.append(out)
        return outputs

    def _note_prompt_logprobs(self, entry: StepEntry, logits: np.ndarray) -> np.ndarray:
        """Records the prompt logprobs a chunk's logits [k, vocab] give; returns its last row [vocab]."""
        req = entry.request
        live = self._live.get(req.request_id)
        if live is not None:
            live.prompt_logprobs += chunk_prompt_logprobs(logits, req.prompt_ids, req.prefilled,
                                                          req.params.prompt_logprobs)
        return logits[-1]

    def _process_logits(self, rows: list[tuple[StepEntry, np.ndarray]]) -> dict[str, np.ndarray]:
        """logit_bias, penalties (one batched pass) and grammar masks of the rows about to sample.

        Returns:
            request id -> processed [vocab] logits, for the requests that have any processing; if the
            batched pass fails, each request is processed alone so that only a failing one ends.
        """
        todo = [(e.request, x) for e, x in rows
                if e.request.params.penalized or self._live[e.request.request_id].matcher is not None]
        if not todo:
            return {}
        try:
            return self._process_batch(todo)
        except Exception:  # noqa: BLE001 - retried alone below; the failing one ends in _advance
            out = {}
            for req, x in todo:
                try:
                    out.update(self._process_batch([(req, x)]))
                except Exception as exc:  # noqa: BLE001
                    log.error("request %s: processing its logits failed: %r", req.request_id, exc, exc_info=exc)
            return out

    def _process_batch(self, todo: list[tuple[Request, np.ndarray]]) -> dict[str, np.ndarray]:
        """Penalties and masks of `todo`'s rows ([vocab] logits each): request id -> processed row."""
        reqs = [r for r, _ in todo]
        logits = process_logits(np.stack([x for _, x in todo]), [r.params for r in reqs], [r.prompt_ids for r in reqs],
                                [r.output_ids for r in reqs], [self._live[r.request_id].matcher for r in reqs])
        return {r.request_id: logits[i] for i, r in enumerate(reqs)}

    def _advance(self, entry: StepEntry, logits: np.ndarray, processed: np.ndarray | None) -> RequestOutput | None:
        """Commits one sequence's step: a prompt chunk, or sample, detokenize and check the stops.

        Args:
            entry: The sequence's share of the step.
            logits: [vocab] raw logits of its last new token (logprobs are reported from these), or the
                0-d token id the device chose for a plain greedy step.
            processed: [vocab] the logits after penalties and grammar, or None when there are none.
        """
        req = entry.request
        live = self._live[req.request_id]
        if processed is None and (req.params.penalized or live.matcher is not None) and entry.samples:
            raise RuntimeError("processing the logits (penalties or grammar) failed")
        if req.in_prefill:
            req.prefilled += entry.tokens
            if not entry.samples:
                self.runner.advance(live.seq, None)
                return None
            if req.params.max_tokens == 0:  # echo with logprobs only: the prompt's logprobs are the answer
                return self._finish(req, "length", prompt_logprobs=tuple(live.prompt_logprobs))
        # A 0-d row is the argmax already taken on the device (_run: a plain greedy step).
        tok = int(logits) if logits.ndim == 0 else live.sampler.sample(logits if processed is None else processed)
        if live.matcher is not None:
            live.matcher.accept(tok)
        lp = () if req.params.logprobs is None else (token_logprob(logits, tok, req.params.logprobs),)
        plp = ()
        if not req.output_ids and req.params.prompt_logprobs is not None:
            plp = tuple(live.prompt_logprobs)
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
            elif live.matcher is not None and live.matcher.done:  # nothing but the end token could follow
                reason = "stop"
                delta += live.detok.flush()
            elif len(req.output_ids) >= req.params.max_tokens:
                reason = "length"
                delta += live.detok.flush()
        if reason:
            return self._finish(req, reason, delta=delta, new=(tok,), logprobs=lp, prompt_logprobs=plp)
        return RequestOutput(req.request_id, (tok,), delta, False, None, len(req.prompt_ids),
                             len(req.output_ids), logprobs=lp, prompt_logprobs=plp,
                             cached_tokens=req.cached_tokens, index=req.index)

    def _admit_and_abort(self) -> list[RequestOutput]:
        with self._lock:
            pending, self._pending = self._pending, []
            aborts, self._aborts = self._aborts, set()
        outputs, deferred = [], []
        for req in pending:
            if req.request_id in aborts:  # aborted before it was admitted: it holds nothing yet
                outputs.append(self._finish(req, "abort"))
                continue
            leader = req.leader
            if leader is not None and leader.state is not RequestState.FINISHED and \
                    (leader.state is RequestState.WAITING or leader.in_prefill):
                deferred.append(req)  # admitted once the leader's prompt pages are in the cache
                continue
            try:
                self._admit(req)
            except Exception as exc:  # noqa: BLE001
                outputs.append(self._fail(req, "admission", exc))
        for rid in aborts:
            req = next((r for r in [*self.scheduler.running, *self.scheduler.waiting] if r.request_id == rid), None)
            if req is not None:
                outputs.append(self._finish(req, "abort"))
        if deferred:
            with self._lock:
                self._pending[:0] = deferred
        return outputs

    def _admit(self, req: Request) -> None:
        """Gives a submitted request its sampler, detokenizer and cache slot, and queues it."""
        sampler = Sampler(req.params, req.index)
        detok = IncrementalDetokenizer(self._decode, req.params.stop)
        matcher = None if req.params.grammar is None else self.grammars.matcher(req.params.grammar)
        seq = self.runner.start(req.prompt_ids, req.max_total_tokens + 1)
        self._live[req.request_id] = _Live(seq, sampler, detok, stop_ids_for(req.params, self.eos_ids), matcher)
        self.scheduler.add(req)  # from here on, _finish releases the slot

    def _fail(self, req: Request, stage: str, exc: Exception) -> RequestOutput:
        """Ends one request with an error (a server bug: logged with its id and traceback)."""
        log.error("request %s failed in %s: %r", req.request_id, stage, exc, exc_info=exc)
        return self._finish(req, "error", error=f"internal error in {stage}: {exc}")

    def _finish(self, req: Request, reason: str, delta: str = "", new: tuple[int, ...] = (),
                error: str | None = None, logprobs: tuple[TokenLogprob, ...] = (),
                prompt_logprobs: tuple[TokenLogprob | None, ...] = ()) -> RequestOutput:
        live = self._live.pop(req.request_id, None)
        self.scheduler.finish(req)
        if live is not None and live.seq is not None:
            try:
                self.runner.release(live.seq)
            except Exception as exc:  # noqa: BLE001 - the request ends either way
                log.error("request %s: releasing its KV pages failed: %r", req.request_id, exc, exc_info=exc)
        req.finish_reason, req.error, req.finish_time = reason, error, time.perf_counter()
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        return RequestOutput(req.request_id, new, delta, True, reason, len(req.prompt_ids),
                             len(req.output_ids), error, logprobs, prompt_logprobs, req.cached_tokens, req.index)

    def _decode(self, ids: Sequence[int]) -> str:
        if self._kept_special:  # special tokens are dropped from text, but not the tool-call tags
            return self.tokenizer.decode([i for i in ids if i not in self._skipped_special])
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
                          self.runner.pages_total(), self.scheduler.cached_tokens, self.scheduler.preemptions)
        with self._lock:
            self._load = load


@dataclass
class _Live:
    seq: object  # the runner's sequence (MAX's TextContext)
    sampler: Sampler
    detok: IncrementalDetokenizer
    stop_ids: frozenset[int]
    matcher: GrammarMatcher | None = None
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
