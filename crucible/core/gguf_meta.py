"""Reading GGUF metadata from an open gguf.GGUFReader: one key, or one token's id without
converting the whole vocabulary (Gemma 3's 262k pieces take seconds through `contents()`)."""

from __future__ import annotations

TOKENS_KEY = "tokenizer.ggml.tokens"


def field(reader, key: str, default: object = None) -> object:
    """The value of metadata key `key` (strings decoded, arrays as lists), or default if absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def vocab_size(reader) -> int:
    """The number of pieces in the file's vocabulary (0 without one)."""
    f = reader.fields.get(TOKENS_KEY)
    return 0 if f is None else len(f.data)


def token_id(reader, piece: str) -> int | None:
    """The id of `piece` in the file's vocabulary, or None; compares raw bytes, decodes nothing."""
    f = reader.fields.get(TOKENS_KEY)
    if f is None:
        return None
    want = piece.encode()
    for i, part in enumerate(f.data):
        raw = f.parts[part]
        if len(raw) == len(want) and raw.tobytes() == want:
            return i
    return None
