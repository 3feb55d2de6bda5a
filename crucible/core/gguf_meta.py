"""Opening a GGUF file, and reading its metadata: one key, or one token's id without converting the
whole vocabulary (Gemma 3's 262k pieces take seconds through `contents()`)."""

from __future__ import annotations

import functools
from pathlib import Path

TOKENS_KEY = "tokenizer.ggml.tokens"


def open_gguf(path: str | Path):
    """A gguf.GGUFReader over the file, shared by the opens of one unchanged file (read-only memory map).

    A load opens a file three times (inventory, config, weights), and gguf-py builds its metadata
    element by element: Gemma 3's 262k-piece vocabulary takes ~8 s per open. The key holds the file's
    size and modification time, so a rewritten file is read again.

    Raises:
        ValueError: The file is not a readable GGUF (truncated, corrupt, another format): gguf-py's own
            errors (IndexError, struct errors, ...) name neither the file nor the cause.
    """
    resolved = Path(path).resolve()
    st = resolved.stat()
    return _open_cached(str(resolved), st.st_size, st.st_mtime_ns)


@functools.cache
def _reader_class():
    """gguf.GGUFReader reading its header through a plain ndarray view of the file's memory map.

    gguf-py slices its np.memmap once per metadata value, and memmap's per-slice hooks were most of an
    open (cProfile: 4.2M __array_finalize__ calls for Gemma 3's vocabulary). The views are the same
    bytes of the same mapping; tests/test_gguf_meta.py compares every field and tensor with gguf-py's.
    """
    import gguf
    import numpy as np

    class PlainViewReader(gguf.GGUFReader):
        def _get(self, offset: int, dtype, count: int = 1, override_order=None):
            plain = self.__dict__.get("_plain")
            if plain is None:
                plain = self._plain = self.data.view(np.ndarray)
            count = int(count)
            dt = np.dtype(dtype)
            arr = plain[offset:offset + dt.itemsize * count].view(dt)[:count]
            return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    return PlainViewReader


@functools.lru_cache(maxsize=2)
def _open_cached(path: str, size: int, mtime_ns: int):
    try:
        return _reader_class()(path)
    except (OSError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the parser trips on, the file is at fault
        raise ValueError(f"{Path(path).name} is not a readable GGUF file (truncated or corrupt?): "
                         f"{type(exc).__name__}: {exc}") from exc


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
