"""The tokenizer of a GGUF file whose vocabulary is SentencePiece BPE (`tokenizer.ggml.model = "llama"`)
scored by merge rank, as Gemma 3's is, built the way llama.cpp's SPM tokenizer reads it.

transformers turns a Gemma GGUF vocabulary into a Unigram model over the scores. Gemma 3's scores are
negative merge ranks, not log-probabilities, so Unigram splits words into many short pieces
("The capital" -> "The", "▁c", "ap", "it", "al") and the model sees text it was never trained on.
llama.cpp (llm_tokenizer_spm) instead merges, again and again, the adjacent pair whose merged piece
has the highest score. A BPE model whose merges are every (left, right) split of every piece, ranked by
the merged piece's score, does exactly that; the `tokenizers` library runs it.

Also as llama.cpp does: control and user-defined tokens (`<start_of_turn>`, "\\n\\n", runs of spaces)
are matched as whole tokens before BPE, characters outside the vocabulary fall back to the <0xNN>
byte tokens, spaces become "▁" and no prefix space is added (`tokenizer.ggml.add_space_prefix`).
"""

from __future__ import annotations

import numpy as np

from crucible.core.gguf_meta import field

# gguf token types (llama.cpp's llama_token_type).
_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6

# Gemma 3's chat template (its Hugging Face tokenizer_config.json), for GGUF files that carry none:
# llama.cpp then falls back to the same turn format (llm_chat_template "gemma"). A system message is
# folded into the first user turn; "assistant" turns are written as "model".
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


def is_scored_spm(reader) -> bool:
    """Whether the file's vocabulary is one this module builds (SentencePiece BPE of Gemma 3)."""
    return field(reader, "tokenizer.ggml.model") == "llama" and field(reader, "general.architecture") == "gemma3"


def merges_by_score(tokens: list[str], scores: np.ndarray, types: np.ndarray) -> list[tuple[str, str]]:
    """Every split (left, right) of every normal piece into two vocabulary pieces, highest merged score first.

    Args:
        tokens: The vocabulary, by id.
        scores: [V] the pieces' scores (higher merges first).
        types: [V] gguf token types; only normal pieces are merge results.

    Returns:
        BPE merges in rank order.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for i, piece in enumerate(tokens):
        if types[i] != _NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), i, cut, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def spm_gguf_tokenizer(reader):
    """A transformers fast tokenizer for a scored SentencePiece GGUF vocabulary (see the module doc).

    Args:
        reader: The open gguf.GGUFReader.

    Returns:
        PreTrainedTokenizerFast with the file's special tokens and chat template (Gemma 3's when the file
        has none); it adds <bos> when the file says so (`tokenizer.ggml.add_bos_token`).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens")]
    scores = np.asarray(field(reader, "tokenizer.ggml.scores"), dtype=np.float32)
    types = np.asarray(field(reader, "tokenizer.ggml.token_type"), dtype=np.int32)
    if field(reader, "tokenizer.ggml.add_space_prefix", False):
        from crucible.core.errors import UnsupportedModelError

        raise UnsupportedModelError("SentencePiece GGUF vocabularies with add_space_prefix are not supported")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = field(reader, "tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(BPE(vocab, merges_by_score(tokens, scores, types), byte_fallback=True,
                        unk_token=tokens[unk_id] if unk_id is not None else None, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in np.flatnonzero(types == _CONTROL)])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i in np.flatnonzero(types == _USER_DEFINED)])

    def special(key: str) -> str | None:
        i = field(reader, f"tokenizer.ggml.{key}_token_id")
        return tokens[int(i)] if i is not None else None

    bos = special("bos")
    if bos is not None and field(reader, "tokenizer.ggml.add_bos_token", False):
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, vocab[bos])])
    template = field(reader, "tokenizer.chat_template") or GEMMA3_CHAT_TEMPLATE
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=special("eos"),
                                   unk_token=special("unknown"), pad_token=special("padding"),
                                   chat_template=template, clean_up_tokenization_spaces=False)
