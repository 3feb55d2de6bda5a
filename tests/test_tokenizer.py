"""GGUF tokenizers: the on-disk cache gives back the tokenizer it stored (ids, special tokens, chat
template, decoding), and a GGUF without tokenizer metadata is a clear error. That the torch-free
conversion equals transformers' own is checked in a real torch-free environment (tests/test_newcomer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core.registry import ModelSource
from crucible.core.tokenizer import chat_prompt_ids, gguf_tokenizer, load_tokenizer, tokenizer_cache_path

TEXTS = ["What is the capital of France?", "  leading spaces and\ttabs\nnewlines", "émoji 🙂 and ünïcödé",
         "<|im_start|>user\nhi<|im_end|>", "1234567890 + 0.5 = ?", ""]
CHATS = [[{"role": "user", "content": "Hi!"}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
          {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]]


def _same(a, b) -> None:
    assert a.get_vocab() == b.get_vocab()
    assert a.all_special_tokens == b.all_special_tokens
    assert a.chat_template == b.chat_template and a.chat_template
    for text in TEXTS:
        ids = a(text, add_special_tokens=False)["input_ids"]
        assert ids == b(text, add_special_tokens=False)["input_ids"], text
        assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)
    for chat in CHATS:
        assert chat_prompt_ids(a, chat) == chat_prompt_ids(b, chat)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_cache_gives_back_the_converted_tokenizer(arch: str, tiny_models, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CRUCIBLE_CACHE_DIR", str(tmp_path))
    path = tiny_models[arch].gguf["Q4_0"]
    source = ModelSource(str(path), path, "gguf")
    first = load_tokenizer(source)
    assert (tokenizer_cache_path(path) / "tokenizer_config.json").is_file()
    _same(first, load_tokenizer(source))
    _same(first, gguf_tokenizer(path))


def test_a_gguf_without_a_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    import gguf
    import numpy as np

    from graphs.config import UnsupportedModelError

    path = tmp_path / "bare.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(UnsupportedModelError, match="no tokenizer"):
        gguf_tokenizer(path)
