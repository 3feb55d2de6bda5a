"""The Python API for offline generation: `Generator(model=...).generate(prompts, sampling)`.

Prompts are strings (used as chat messages from the user, with the model's chat template) or chats
(lists of {"role", "content"} messages). All of them go through the engine together, so they are
batched continuously. Usable from a notebook. `Generator.create(...)` takes the fields of an OpenAI
request body instead (tools, response_format, n, echo, ...), with the HTTP API's checks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from crucible.core.registry import DEFAULT_MODEL
from pipelines.engine import EngineConfig, LLMEngine
from pipelines.logprobs import TokenLogprob
from pipelines.openai_request import encode_request, final_output, parse_request, prompt_jobs
from pipelines.request import Request
from pipelines.sampling import SamplingParams

Chat = list[dict[str, str]]
Prompt = str | Chat


@dataclass(frozen=True)
class GenerationResult:
    """The outcome of one prompt.

    Attributes:
        text: Generated text (stop strings and special tokens excluded).
        token_ids: Generated token ids.
        finish_reason: "stop", "length", "abort" or "error".
        prompt_tokens: Prompt length in tokens.
        completion_tokens: Generated tokens.
        time_to_first_token_s: Seconds from submission to the first token.
        total_time_s: Seconds from submission to the end.
        error: Message when finish_reason is "error".
        logprobs: Per generated token, when SamplingParams.logprobs asked for them.
        tool_calls: The calls the model made (`create` with tools), each an OpenAI tool_calls entry.
        prompt_logprobs: Per prompt token (None for the first) when echo with logprobs asked for them.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float | None
    total_time_s: float
    error: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    tool_calls: list[dict] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)


def _messages(prompt: Prompt) -> Chat:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return list(prompt)


class Generator:
    """Loads a model once and generates for batches of prompts.

    Args:
        model: Registry name, .gguf file or HF folder (default: the embedded SmolLM2).
        engine: A ready engine to reuse instead (model and settings are ignored then).
        **settings: EngineConfig fields (device, max_batch_size, max_step_tokens, kv_cache_gib, ...).
    """

    def __init__(self, model: str = DEFAULT_MODEL, engine: LLMEngine | None = None, **settings) -> None:
        self.engine = engine or LLMEngine(EngineConfig(model=model, **settings))
        self.tokenizer = self.engine.tokenizer

    def encode(self, prompt: Prompt, raw: bool = False) -> list[int]:
        """Token ids of a prompt: chat-templated unless raw text continuation is asked for."""
        from crucible.core.tokenizer import encode_prompt

        if raw and isinstance(prompt, str):
            return encode_prompt(self.tokenizer, prompt, chat=False)
        req = parse_request({"messages": _messages(prompt)}, "chat", 1, require_model=False)
        return encode_request(self.tokenizer, req)[0]

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 raw: bool = False) -> list[GenerationResult]:
        """Generates for every prompt (batched together) and returns results in prompt order."""
        params = sampling if isinstance(sampling, Sequence) else [sampling or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        return self.generate_ids([self.encode(p, raw) for p in prompts], params)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list[GenerationResult]:
        """Like generate, from token ids (each params.n must be 1; see `create` for n > 1)."""
        return self._run(self.submit_jobs(list(zip(prompt_ids, params))))

    def create(self, kind: str = "chat", **body) -> list[GenerationResult]:
        """Generates for one OpenAI request body, as /v1/chat/completions or /v1/completions would.

        Args:
            kind: "chat" (messages=...) or "completion" (prompt=...).
            **body: The body's fields (model may be left out); checked as the HTTP API checks them.

        Returns:
            One result per choice, in choice order (prompt * n + sequence).

        Raises:
            RequestError: A field that is malformed, out of range or not supported (a ValueError).
        """
        engine = self.engine
        req = parse_request(body, kind, engine.max_seq_len, require_model=False)
        results = self._run(self.submit_jobs(prompt_jobs(self.tokenizer, req, engine.max_seq_len)))
        out = []
        for r in results:
            content, calls, reason = final_output(req, r.text, r.finish_reason)
            out.append(GenerationResult(content, r.token_ids, reason, r.prompt_tokens, r.completion_tokens,
                                        r.time_to_first_token_s, r.total_time_s, r.error, r.logprobs,
                                        [c.openai() for c in calls], r.prompt_logprobs))
        return out

    def submit_jobs(self, jobs: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[Request]:
        """Submits each (prompt ids, params) job's n sequences; if one fails, those already submitted are
        aborted and the error raised."""
        reqs: list[Request] = []
        try:
            for ids, p in jobs:
                reqs += self.engine.submit_n(ids, p)
        except BaseException:
            for r in reqs:
                self.engine.abort(r.request_id)
            raise
        return reqs

    def _run(self, reqs: list[Request]) -> list[GenerationResult]:
        texts = {r.request_id: [] for r in reqs}
        logprobs = {r.request_id: [] for r in reqs}
        prompt_logprobs = {r.request_id: [] for r in reqs}
        while self.engine.has_work:
            for out in self.engine.step():
                if out.request_id in texts:
                    texts[out.request_id].append(out.text_delta)
                    logprobs[out.request_id].extend(out.logprobs)
                    prompt_logprobs[out.request_id].extend(out.prompt_logprobs)
        results = []
        for r in reqs:
            ttft = (r.first_token_time - r.arrival) if r.first_token_time else None
            results.append(GenerationResult("".join(texts[r.request_id]), list(r.output_ids),
                                            r.finish_reason or "error",
                                            len(r.prompt_ids), len(r.output_ids), ttft,
                                            (r.finish_time or time.perf_counter()) - r.arrival, r.error,
                                            logprobs[r.request_id], prompt_logprobs=prompt_logprobs[r.request_id]))
        return results
