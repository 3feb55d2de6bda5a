"""A GGUF model as a float32 Hugging Face folder, for runtimes that cannot read its blocks.

MAX's built-in Llama pipeline runs float32 on CPU and has no Q4_1 reader, so its baseline runs on the
same weights dequantized: transformers reads the GGUF (dequantizing every block, undoing llama.cpp's
q/k permutation) and writes safetensors, config.json and the tokenizer with its chat template. The
folder is cached, keyed by the file's path, size and mtime; it is written under a temporary name
and renamed, so an interrupted export leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from crucible.core.registry import ModelSource
from crucible.core.tokenizer import cache_dir, file_key, load_tokenizer


def export_hf_float32(source: ModelSource, log=print) -> Path:
    """Returns a float32 Hugging Face folder holding the GGUF model's weights (exported once).

    Args:
        source: A GGUF model (an HF folder is returned as is).
        log: Progress messages.

    Raises:
        ImportError: torch is missing (install the `test` extra: scripts/bootstrap.sh test).
    """
    if source.format == "hf":
        return source.path
    final = cache_dir() / "exports" / f"{source.path.stem}-f32-{file_key(source.path)}"
    if (final / "config.json").is_file():
        return final
    import torch
    from transformers import AutoModelForCausalLM

    log(f"exporting {source.path.name} to float32 safetensors (once) ...")
    model = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name,
                                                 dtype=torch.float32)
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    load_tokenizer(source).save_pretrained(tmp)
    try:
        tmp.rename(final)
    except OSError:  # another process exported it first
        shutil.rmtree(tmp, ignore_errors=True)
    return final
