"""A small byte-level BPE tokenizer built locally (no hub), with ChatML special tokens.

The tiny test models use it in both their Hugging Face and GGUF forms, so the two tokenize identically.
It is trained on a fixed built-in corpus, which makes it deterministic: the same vocabulary and merges on
every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Ids 0, 1, 2 as in SmolLM2, so the tiny models exercise the same special-token handling.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_TOKEN, EOS_TOKEN = "<|im_start|>", "<|im_end|>"

# ChatML, the SmolLM2/Qwen2 template shape (without SmolLM2's default system prompt).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS_SENTENCES = (
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "What is the capital of France? The answer is Paris.",
    "A large language model predicts the next token from the tokens before it.",
    "Kernels run the hot path: matrix multiplication, attention, normalization and rotary embeddings.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Hello, how are you today? I am fine, thank you for asking.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 42 100 2048 appear in text too.",
    "You are a helpful assistant. Answer the question briefly and correctly.",
    "Water boils at one hundred degrees and freezes at zero degrees Celsius.",
    "Once upon a time there was a small model that learned to write short stories.",
    "Paged attention stores keys and values in fixed size pages of the cache.",
    "Quantized weights keep four or eight bits per value with a scale for each block.",
)


@dataclass(frozen=True)
class TinyTokenizerSpec:
    """Configuration of the locally built tokenizer.

    Attributes:
        vocab_size: Target vocabulary size, special tokens included; the trainer stops there.
    """

    vocab_size: int = 400

    def __post_init__(self) -> None:
        # 256 byte-level symbols + the specials must fit, with room left for merges.
        if self.vocab_size < 256 + len(SPECIAL_TOKENS) + 16:
            raise ValueError(f"vocab_size {self.vocab_size} too small for a byte-level BPE")


def build_tokenizer(spec: TinyTokenizerSpec) -> Tokenizer:
    """Trains the byte-level BPE tokenizer on the built-in corpus.

    Args:
        spec: Tokenizer configuration.

    Returns:
        A ``tokenizers.Tokenizer`` whose ids 0..2 are the ChatML special tokens.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the corpus gives the frequent pairs clear counts; ties are broken deterministically.
    corpus = [s for s in _CORPUS_SENTENCES for _ in range(4)]
    tok.train_from_iterator(corpus, trainer=trainer)
    for i, special in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(special) != i:
            raise RuntimeError(f"special token {special} did not get id {i}")
    return tok


def vocab_in_id_order(tok: Tokenizer) -> list[str]:
    """Returns the token strings ordered by id (the GGUF ``tokenizer.ggml.tokens`` list)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise RuntimeError("tokenizer ids are not contiguous")
    return [t for t, _ in ordered]


def merges_of(tok: Tokenizer) -> list[str]:
    """Returns the BPE merges as ``"left right"`` strings (the GGUF ``tokenizer.ggml.merges`` list)."""
    import json

    model = json.loads(tok.to_str())["model"]
    return [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
