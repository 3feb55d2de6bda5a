"""Tokenizer and chat template of a model, from its Hugging Face folder or from its GGUF file.

transformers builds a fast tokenizer from GGUF metadata (~20 s for SmolLM2's 49k-token vocabulary), so
the converted tokenizer is cached on disk, keyed by the file's path, size and mtime.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from crucible.registry import ModelSource

Message = dict[str, str]


def cache_dir() -> Path:
    """Crucible's on-disk cache: $CRUCIBLE_CACHE_DIR or ~/.cache/crucible."""
    return Path(os.environ.get("CRUCIBLE_CACHE_DIR", Path.home() / ".cache" / "crucible"))


def file_key(path: Path) -> str:
    """A cache key for a file's current content: its resolved path, size and mtime."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def load_tokenizer(source: ModelSource):
    """A transformers tokenizer for the model (cached conversion for GGUF files)."""
    from transformers import AutoTokenizer

    if source.format == "hf":
        return AutoTokenizer.from_pretrained(source.path)
    key = file_key(source.path)
    cached = cache_dir() / "tokenizers" / key
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    tok = AutoTokenizer.from_pretrained(source.path.parent, gguf_file=source.path.name)
    tmp = cached.with_name(key + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    try:
        tmp.rename(cached)
    except OSError:  # another process cached it first
        pass
    return tok


def chat_prompt_ids(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Applies the model's chat template with the generation prompt and tokenizes."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
