"""The engine's settings, its errors and the records it publishes (pipelines/engine.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from crucible.core.registry import DEFAULT_MODEL
from pipelines.scheduler import DEFAULT_CPU_BATCH


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
        prefix_caching: Reuse the KV pages of prompt prefixes already in the cache.
        dtype: The graph's compute dtype ("auto", "float32" or "bfloat16"; ModelOptions.dtype).
    """

    model: str = DEFAULT_MODEL
    device: str = "cpu"
    max_batch_size: int = DEFAULT_CPU_BATCH
    max_step_tokens: int = 512
    kv_cache_gib: float = 1.0
    max_seq_len: int | None = None
    activations: str = "f32"
    prefix_caching: bool = True
    dtype: str = "auto"

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
        cached_tokens: Prompt tokens reused from the prefix cache since the engine started.
        preemptions: Requests preempted (pages given back, recomputed later) since the engine started.
    """

    waiting: int = 0
    running: int = 0
    pages_used: int = 0
    pages_total: int = 0
    cached_tokens: int = 0
    preemptions: int = 0


@dataclass
class EngineStats:
    """Counters since the engine started."""

    steps: int = 0
    step_seconds: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> count
