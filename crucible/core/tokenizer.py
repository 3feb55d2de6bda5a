"""Tokenizer and chat template of a model, from its Hugging Face folder or from its GGUF file.

A GGUF file's tokenizer is built from its metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) by
transformers' own GGUF path, which otherwise insists on torch; the base install has no torch. Gemma 3's
SentencePiece vocabulary is built by crucible.core.spm_tokenizer instead (transformers misreads it). The
converted tokenizer is cached on disk, keyed by the file's path, size and mtime, since a 49k-token
vocabulary takes seconds to convert.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Sequence
from pathlib import Path

from crucible.core.gguf_meta import open_gguf
from crucible.core.registry import ModelSource

Message = dict[str, str]
# Part of the converted-tokenizer cache key: bump it when the conversion changes (v2: Gemma 3's
# SentencePiece vocabulary through crucible.core.spm_tokenizer), so no stale conversion is reused.
CONVERTER_VERSION = "v2"


def cache_dir() -> Path:
    """Crucible's on-disk cache: $CRUCIBLE_CACHE_DIR or ~/.cache/crucible."""
    return Path(os.environ.get("CRUCIBLE_CACHE_DIR", Path.home() / ".cache" / "crucible"))


def file_key(path: Path) -> str:
    """A cache key for a file's current content: its resolved path, size and mtime."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def tokenizer_cache_path(path: Path) -> Path:
    """Where a GGUF file's converted tokenizer is cached (file_key and CONVERTER_VERSION)."""
    return cache_dir() / "tokenizers" / f"{file_key(path)}-{CONVERTER_VERSION}"


def load_tokenizer(source: ModelSource):
    """A transformers tokenizer for the model (cached conversion for GGUF files)."""
    from transformers import AutoTokenizer

    if source.format == "hf":
        return AutoTokenizer.from_pretrained(source.path)
    cached = tokenizer_cache_path(source.path)
    key = cached.name
    if (cached / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(cached)
    tok = gguf_tokenizer(source.path)
    tmp = cached.with_name(key + f".tmp{os.getpid()}")
    tok.save_pretrained(tmp)
    try:
        tmp.rename(cached)
    except OSError:  # another process cached it first
        pass
    return tok


def gguf_tokenizer(path: Path):
    """Builds the tokenizer of a GGUF file from its metadata, as transformers does, without torch.

    `AutoTokenizer.from_pretrained(gguf_file=...)` reads the file with `load_gguf_checkpoint`, which
    refuses to run without torch although only its tensor path (not taken for a tokenizer) uses it.
    The gate is opened for this call alone, so the tokenizer class, special tokens and chat template
    are exactly transformers' (tests/test_newcomer.py compares a torch-free environment's token ids
    with the test environment's).

    Args:
        path: The .gguf file.

    Returns:
        The transformers tokenizer with the file's vocabulary, special tokens and chat template.
    """
    from unittest import mock

    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers import AutoTokenizer

    from crucible.core.spm_tokenizer import is_scored_spm, spm_gguf_tokenizer

    reader = open_gguf(path)
    if "tokenizer.ggml.tokens" not in reader.fields:
        from crucible.core.errors import UnsupportedModelError

        raise UnsupportedModelError(f"{path} has no tokenizer in its metadata (tokenizer.ggml.tokens)")
    if is_scored_spm(reader):  # transformers reads Gemma 3's merge ranks as Unigram scores
        return spm_gguf_tokenizer(reader)
    with mock.patch.object(gguf_utils, "is_torch_available", lambda: True):
        return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def chat_prompt_ids(tokenizer, messages: Sequence[Message]) -> list[int]:
    """Applies the model's chat template with the generation prompt and tokenizes."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer, prompt: str | Sequence[Message], chat: bool = True) -> list[int]:
    """The token ids of a prompt, the one encoding that serve, batch, Generator and the CLI share.

    Args:
        tokenizer: The model's tokenizer.
        prompt: Chat messages, or a string (one user message when `chat`, else raw text).
        chat: Apply the chat template; False continues a raw string as it is, after the model's <bos>
            when its tokenizer adds one (Gemma 3's GGUF and HF Llama 3 folders do; llama.cpp adds it too,
            and Gemma 3 without it writes "The The The ..."), once: a text that starts with <bos> itself
            does not get a second.

    Returns:
        The prompt's token ids.
    """
    if isinstance(prompt, str) and not chat:
        ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        bos = tokenizer.bos_token_id
        return ids[1:] if bos is not None and ids[:2] == [bos, bos] else ids
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return chat_prompt_ids(tokenizer, messages)


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character -> byte: printable bytes stand for themselves, the
    other 68 for the characters from U+0100 on."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
          *range(ord("\u00ae"), ord("\u00ff") + 1)]
    cs = list(bs)
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)  # 188 printable bytes come first: U+0100, U+0101, ...
    return {chr(c): b for b, c in zip(bs, cs)}


class TokenBytes:
    """The bytes each token stands for, as OpenAI's logprobs report them: a token may hold part of a
    character, which its decoded text shows only as U+FFFD. One reader per tokenizer (it caches).

    Mirrors the tokenizer's decoder: byte-fallback pieces (<0xE2>) are their byte where the decoder has
    ByteFallback (SentencePiece); byte-level BPE pieces (SmolLM2, Llama 3, Qwen) map back through GPT-2's
    alphabet; other pieces are text with U+2581 as a space; added and special tokens are their text.
    """

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        self._added = {i: text for text, i in tokenizer.get_added_vocab().items()}  # specials included
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = repr(backend.decoder) if backend is not None else ""
        self._byte_level = "ByteLevel" in decoder
        self._byte_fallback = "ByteFallback" in decoder or backend is None
        self._memo: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        token_id = int(token_id)
        raw = self._memo.get(token_id)
        if raw is None:
            raw = self._memo[token_id] = self._read(token_id)
        return raw

    def _read(self, token_id: int) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode("utf-8")
        piece = self._tok.convert_ids_to_tokens(token_id)
        if not isinstance(piece, str):
            return self._tok.decode([token_id]).encode("utf-8")
        byte = _BYTE_PIECE.fullmatch(piece) if self._byte_fallback else None
        if byte:
            return bytes([int(byte.group(1), 16)])
        if self._byte_level:
            alphabet = _byte_level_alphabet()
            if all(c in alphabet for c in piece):
                return bytes(alphabet[c] for c in piece)
        return piece.replace("\u2581", " ").encode("utf-8")
