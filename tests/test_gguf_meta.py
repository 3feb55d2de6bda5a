"""GGUF metadata reads (crucible/core/gguf_meta.py): a token's id found from raw bytes matches the
decoded vocabulary, without decoding it."""

from __future__ import annotations

from pathlib import Path

import gguf

from crucible.core import gguf_meta


def _file(path: Path, tokens: list[str]) -> gguf.GGUFReader:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_token_list(tokens)
    w.add_uint32("llama.block_count", 3)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return gguf.GGUFReader(str(path))


def test_token_id_and_vocab_size_read_raw_bytes(tmp_path) -> None:
    tokens = ["<pad>", "<eos>", "<end_of_turn", "<end_of_turn>", "héllo", "<end_of_turn>x"]
    reader = _file(tmp_path / "v.gguf", tokens)
    assert gguf_meta.vocab_size(reader) == len(tokens)
    for i, piece in enumerate(tokens):
        assert gguf_meta.token_id(reader, piece) == i
    assert gguf_meta.token_id(reader, "<start_of_turn>") is None  # control: absent
    assert gguf_meta.field(reader, "llama.block_count") == 3
    assert gguf_meta.field(reader, "llama.missing", 7) == 7


def test_no_vocabulary(tmp_path) -> None:
    reader = _file(tmp_path / "e.gguf", [])
    assert gguf_meta.token_id(reader, "<eos>") is None


def test_one_reader_per_unchanged_file(tmp_path) -> None:
    """A load opens its file three times: they share one reader, and a rewritten file is read again."""
    import os

    path = tmp_path / "r.gguf"
    _file(path, ["<pad>", "<eos>"])
    first = gguf_meta.open_gguf(path)
    assert gguf_meta.open_gguf(str(path)) is first
    _file(path, ["<pad>", "<eos>", "<bos>"])
    os.utime(path, ns=(0, os.stat(path).st_mtime_ns + 1_000_000))  # a new mtime even on coarse clocks
    second = gguf_meta.open_gguf(path)
    assert second is not first and gguf_meta.vocab_size(second) == 3


def test_plain_view_reader_reads_what_gguf_py_reads(tmp_path) -> None:
    """open_gguf's reader (plain ndarray views of the memory map) against gguf-py's own, on a whole model
    file: every field's parts, indices, types and contents, every tensor's type, shape and bytes."""
    import numpy as np

    from tests.support.tiny_models import TINY_LLAMA, write_gguf

    path = write_gguf(TINY_LLAMA, tmp_path / "m.gguf", "Q8_0")
    ours, theirs = gguf_meta.open_gguf(path), gguf.GGUFReader(str(path))
    assert type(ours) is not gguf.GGUFReader and list(ours.fields) == list(theirs.fields)
    assert any(f.types[-1] == gguf.GGUFValueType.STRING and len(f.data) > 1 for f in ours.fields.values())
    for key, fa in ours.fields.items():
        fb = theirs.fields[key]
        assert (fa.data, fa.types, len(fa.parts)) == (fb.data, fb.types, len(fb.parts)), key
        assert fa.contents() == fb.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for ta, tb in zip(ours.tensors, theirs.tensors):
        assert (ta.tensor_type, list(ta.shape), ta.data.shape, ta.data.dtype) == \
            (tb.tensor_type, list(tb.shape), tb.data.shape, tb.data.dtype), ta.name
        assert np.array_equal(np.asarray(ta.data).view(np.uint8), np.asarray(tb.data).view(np.uint8)), ta.name
