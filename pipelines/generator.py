"""The Python API for offline generation: `Generator(model=...).generate(prompts, sampling)`.

Prompts are strings (used as chat messages from the user, with the model's chat template) or chats
(lists of {"role", "content"} messages). All of them go through the engine together, so they are
batched continuously. Usable from a notebook.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from crucible.core.registry import DEFAULT_MODEL
from pipelines.engine import EngineConfig, LLMEngine
from pipelines.logprobs import TokenLogprob
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


def _messages(prompt: Prompt) -> Chat:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return list(prompt)


def validate_messages(messages: object) -> Chat:
    """Checks a chat: a non-empty list of {"role": system|user|assistant|tool, "content": str}."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'content'")
        if m.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"messages[{i}].role must be one of system, user, assistant, tool")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


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
        return encode_prompt(self.tokenizer, validate_messages(_messages(prompt)))

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                 raw: bool = False) -> list[GenerationResult]:
        """Generates for every prompt (batched together) and returns results in prompt order."""
        params = sampling if isinstance(sampling, Sequence) else [sampling or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        return self.generate_ids([self.encode(p, raw) for p in prompts], params)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list[GenerationResult]:
        """Like generate, from token ids."""
        reqs = [self.engine.submit(ids, p) for ids, p in zip(prompt_ids, params)]
        texts = {r.request_id: [] for r in reqs}
        logprobs = {r.request_id: [] for r in reqs}
        while self.engine.has_work:
            for out in self.engine.step():
                if out.request_id in texts:
                    texts[out.request_id].append(out.text_delta)
                    logprobs[out.request_id].extend(out.logprobs)
        results = []
        for r in reqs:
            ttft = (r.first_token_time - r.arrival) if r.first_token_time else None
            results.append(GenerationResult("".join(texts[r.request_id]), list(r.output_ids), r.finish_reason or "error",
                                            len(r.prompt_ids), len(r.output_ids), ttft,
                                            (r.finish_time or time.perf_counter()) - r.arrival, r.error,
                                            logprobs[r.request_id]))
        return results
