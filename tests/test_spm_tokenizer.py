"""Gemma 3's SentencePiece GGUF tokenizer (crucible.core.spm_tokenizer) against a direct transcription of
llama.cpp's SPM algorithm (llm_tokenizer_spm): repeatedly merge the adjacent pair whose merged piece
scores highest (leftmost first on ties), then map leftover characters to <0xNN> byte tokens.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from crucible.core.tokenizer import load_tokenizer
from crucible.core.registry import resolve_model
from tests.support.tiny_models import spm_vocab

TEXTS = (
    "The capital of France is Paris.",
    "the theatre and the other thesis",
    "  two leading spaces, trailing  ",
    "Kernels run the hot path: attention, normalization.",
    "ünïcödé and 🤖 fall back to bytes",
    "other and then",
    "a",
    "",
)


def llamacpp_spm(text: str, tokens: list[str], scores: list[float]) -> list[int]:
    """llama.cpp's llm_tokenizer_spm on one text without special tokens (add_space_prefix false)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    syms = list(text.replace(" ", "▁"))  # llama_escape_whitespace; symbols are UTF-8 characters
    alive = [True] * len(syms)
    nxt, prv = list(range(1, len(syms) + 1)), list(range(-1, len(syms) - 1))
    heap: list[tuple[float, int, str, str]] = []

    def push(left: int, right: int) -> None:
        if left < 0 or right >= len(syms):
            return
        merged = syms[left] + syms[right]
        if merged in vocab:
            heapq.heappush(heap, (-scores[vocab[merged]], left, syms[left], syms[right]))

    for i in range(len(syms) - 1):
        push(i, i + 1)
    while heap:
        _, left, a, b = heapq.heappop(heap)
        right = nxt[left]
        if not alive[left] or right >= len(syms) or syms[left] != a or syms[right] != b:
            continue  # stale bigram
        syms[left] = a + b
        alive[right] = False
        nxt[left] = nxt[right]
        if nxt[left] < len(syms):
            prv[nxt[left]] = left
        push(prv[left], left)
        push(left, nxt[left])
    out: list[int] = []
    for i, s in enumerate(syms):
        if alive[i]:
            out += [vocab[s]] if s in vocab else [vocab[f"<0x{b:02X}>"] for b in s.encode()]
    return out


@pytest.fixture(scope="module")
def gemma_tokenizer(tiny_models):
    return load_tokenizer(resolve_model(str(tiny_models["gemma3"].gguf["Q8_0"])))


def test_matches_llamacpp_spm(gemma_tokenizer) -> None:
    tokens, scores, _ = spm_vocab(gemma_tokenizer.vocab_size)
    for text in TEXTS:
        ids = gemma_tokenizer(text)["input_ids"]
        assert ids[0] == tokens.index("<bos>")  # tokenizer.ggml.add_bos_token
        assert ids[1:] == llamacpp_spm(text, tokens, scores), text
        assert gemma_tokenizer.decode(ids, skip_special_tokens=True) == text


def test_merges_follow_scores_not_unigram(gemma_tokenizer) -> None:
    # Control: a Unigram reading of the same scores (what transformers' GGUF Gemma converter builds)
    # segments these words differently ("other" -> o t h er, where llama.cpp merges o t he r).
    from tokenizers import Tokenizer, normalizers
    from tokenizers.models import Unigram

    tokens, scores, _ = spm_vocab(gemma_tokenizer.vocab_size)
    unigram = Tokenizer(Unigram(list(zip(tokens, scores)), unk_id=3, byte_fallback=True))
    unigram.normalizer = normalizers.Replace(" ", "▁")
    text = "other and then"
    ours = gemma_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ours == llamacpp_spm(text, tokens, scores) != unigram.encode(text).ids


def test_chat_template_is_gemma3s(gemma_tokenizer) -> None:
    # The file carries no chat template (as the packaged Gemma 3 270M): Gemma 3's is supplied.
    text = gemma_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
        tokenize=False, add_generation_prompt=True)
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    ids = gemma_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(gemma_tokenizer.convert_tokens_to_ids("<start_of_turn>")) == 4
    assert np.sum(np.array(ids) == gemma_tokenizer.convert_tokens_to_ids("<bos>")) == 1
