"""The reference: Hugging Face transformers on CPU torch, for any model Crucible loads (GGUF included).

Our graphs are checked against this module: full-sequence logits and greedy continuations. For GGUF
models transformers dequantizes every tensor to float, so the reference runs on exactly the weights our
quantized kernels decode, and parity bounds can stay tight.

torch is a test dependency (``pip install -e .[test]``); importing this module without it fails with a
message that says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from crucible.core.registry import ModelSource, resolve_model
from crucible.core.tokenizer import chat_prompt_ids, load_tokenizer

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the install profile
    raise ImportError(
        "crucible.reference needs CPU torch: install the test extra (scripts/bootstrap.sh test, "
        "or pip install torch==2.13.0)"
    ) from exc


Message = dict[str, str]


@dataclass(frozen=True)
class GreedyResult:
    """A greedy continuation.

    Attributes:
        prompt_ids: The prompt's token ids.
        token_ids: Generated ids (stops after an end-of-turn id, which is included).
        text: The generated ids decoded, special tokens skipped.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    text: str


class Reference:
    """transformers' causal LM and tokenizer for one model, in float32 (or float64) on CPU.

    Args:
        model: A registry name, a ``.gguf`` file, a Hugging Face folder or a resolved ``ModelSource``.
        dtype: torch dtype for the computation; float64 gives a reference for tight kernel bounds.
    """

    def __init__(self, model: str | ModelSource, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM

        self.source = model if isinstance(model, ModelSource) else resolve_model(model)
        kwargs: dict[str, Any] = {}
        folder = self.source.path
        if self.source.format == "gguf":
            kwargs["gguf_file"] = self.source.path.name
            folder = self.source.path.parent
        self.tokenizer = load_tokenizer(self.source)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
        self.model.eval()
        self.dtype = dtype

    @property
    def eos_token_ids(self) -> set[int]:
        """End-of-sequence ids from the model's generation config and config."""
        ids: set[int] = set()
        for cfg in (self.model.generation_config, self.model.config):
            eos = getattr(cfg, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif eos:
                ids.update(eos)
        return ids

    def chat_prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """Applies the model's chat template with the generation prompt and tokenizes."""
        return chat_prompt_ids(self.tokenizer, messages)

    @torch.inference_mode()
    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Full-sequence logits.

        Args:
            token_ids: One sequence of token ids, length seq_len.

        Returns:
            float32 array [seq_len, vocab_size]: row t predicts token t + 1.
        """
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        out = self.model(input_ids=ids, use_cache=False)
        return out.logits[0].to(torch.float32).numpy()

    @torch.inference_mode()
    def greedy(self, prompt_ids: Sequence[int], max_new_tokens: int) -> GreedyResult:
        """Greedy decoding with transformers' own KV cache, stopping at an end-of-sequence id.

        Args:
            prompt_ids: The prompt's token ids.
            max_new_tokens: Upper bound on generated tokens.

        Returns:
            The generated ids and their text.
        """
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(self.eos_token_ids) or None,
            pad_token_id=self.tokenizer.pad_token_id or 0,
        )
        new = [int(t) for t in out[0, ids.shape[1]:]]
        return GreedyResult(list(prompt_ids), new, self.tokenizer.decode(new, skip_special_tokens=True))

    def greedy_chat(self, messages: Sequence[Message], max_new_tokens: int = 32) -> GreedyResult:
        """Greedy answer to a chat (the model's template with a generation prompt)."""
        return self.greedy(self.chat_prompt_ids(messages), max_new_tokens)
