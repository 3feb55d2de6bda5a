"""Grammar-constrained decoding (structured output, tool calls) with llguidance.

Each constrained sequence has a matcher that, before every draw, fills a bitmask of the tokens that keep
the output inside the grammar; banned tokens get -inf logits, and the drawn token advances the matcher.
When the grammar is complete only the end token is allowed, so generation stops there.

llguidance rather than xgrammar (benchmarks/grammar_mask.py measures both on SmolLM2's 49k vocabulary):
their mask costs are close (10-15 us a token, 0.1 ms a step for 16 streams), but llguidance needs only
numpy where xgrammar imports torch, its JSON-schema compiler names a feature it does not implement where
xgrammar accepted five such schemas silently and then let invalid documents through, and it takes Lark
grammars with embedded JSON schemas, which the tool-call grammar (pipelines/tools.py) needs.

JSON is compiled without free whitespace (", " and ": " separators): a small model can otherwise spend
its whole budget on blank lines inside a valid document.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("json_object", "json_schema", "lark")
MAX_TEMPLATES = 256  # compiled grammars kept
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that cannot be compiled; the message names the unsupported feature."""


@dataclass(frozen=True)
class Grammar:
    """What the output must match.

    Attributes:
        kind: "json_object" (any JSON object), "json_schema" (`text` is the schema as JSON text) or
            "lark" (`text` is a Lark grammar, which may embed JSON schemas with %json).
        text: The schema or grammar; empty for json_object.
    """

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "json_schema":
            try:
                schema = json.loads(self.text)
            except ValueError as exc:
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict):
                raise GrammarError("the JSON schema must be an object")

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Grammar:
        """The grammar of a JSON schema given as a dict."""
        return cls("json_schema", json.dumps(schema))  # key order kept: properties come out in it

    def llguidance_source(self) -> str:
        """The grammar in llguidance's serialized form."""
        import llguidance

        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.text)
        schema = {"type": "object"} if self.kind == "json_object" else json.loads(self.text)
        return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)


class GrammarMatcher:
    """One sequence's position in its grammar."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._m = matcher
        self.vocab_size = vocab_size
        self._bitmask = np.zeros((1, (vocab_size + 31) // 32), dtype=np.int32)  # [1, words]

    def allowed(self) -> np.ndarray:
        """[vocab] bool: the tokens that keep the output in the grammar."""
        import llguidance.numpy as lnp

        lnp.fill_next_token_bitmask(self._m, self._bitmask, 0)
        bits = np.unpackbits(self._bitmask[0].view(np.uint8), bitorder="little")  # token j = bit j, LSB first
        return bits[: self.vocab_size].astype(bool)

    def mask(self, logits: np.ndarray) -> None:
        """Sets the logits [vocab] of banned tokens to -inf, in place."""
        np.copyto(logits, -np.inf, where=~self.allowed()[: logits.shape[0]])

    def accept(self, token: int) -> None:
        """Advances past a drawn token (which the mask allowed).

        Raises:
            RuntimeError: The token breaks the grammar (the matcher's error says how).
        """
        if not self._m.consume_token(token):
            raise RuntimeError(f"token {token} breaks the grammar: {self._m.get_error()}")

    @property
    def done(self) -> bool:
        """Whether the grammar is complete (only the end token may follow)."""
        return self._m.is_stopped()


class GrammarCompiler:
    """Compiles grammars against one tokenizer and makes matchers; thread-safe.

    Args:
        tokenizer: The model's Hugging Face tokenizer.
        vocab_size: The model's vocabulary (logit rows), which may exceed the tokenizer's.
        eos_ids: The model's end tokens; the first ends a complete grammar.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: tuple[int, ...]) -> None:
        self._hf = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._tok = None  # built on the first grammar: most engines never need one
        # Compiled matchers at the start of their grammar, least recently used first: bounded, since
        # agents may send a new tools list with every request.
        self._templates: OrderedDict[Grammar, Any] = OrderedDict()
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._tok is None:
                self._tok = llguidance_tokenizer(self._hf, self.vocab_size, list(self.eos_ids))
            return self._tok

    def compile(self, grammar: Grammar) -> None:
        """Compiles a grammar once (cached), so that matchers for it are cheap copies.

        Raises:
            GrammarError: It uses a feature llguidance does not implement, or is malformed.
        """
        self._template(grammar)

    def _template(self, grammar: Grammar) -> Any:
        import llguidance

        with self._lock:
            if grammar in self._templates:
                self._templates.move_to_end(grammar)
                return self._templates[grammar]
        try:
            source = grammar.llguidance_source()
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        template = llguidance.LLMatcher(self._tokenizer(), source, log_level=0)  # never raises: check is_error
        if template.is_error():
            raise GrammarError(_clean(template.get_error()))
        with self._lock:
            template = self._templates.setdefault(grammar, template)
            while len(self._templates) > MAX_TEMPLATES:
                self._templates.popitem(last=False)
            return template

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A fresh matcher at the start of the grammar: a copy of the compiled template (~15 us, and it
        shares the template's warm mask cache, where a new matcher starts cold)."""
        template = self._template(grammar)
        with self._lock:
            return GrammarMatcher(template.deep_copy(), self.vocab_size)


def _clean(error: str) -> str:
    """llguidance's message on one line, without its internal trace."""
    return " ".join(error.split())[:500]


def llguidance_tokenizer(tok: Any, vocab_size: int, eos_ids: list[int]) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer.

    A byte-level BPE tokenizer converted from GGUF by transformers has the decoder Sequence[ByteFallback,
    Fuse, Replace, ByteLevel], which llguidance reads as literal characters ('Ġ' instead of a space) and
    so bans every token with a space or newline; a plain ByteLevel decoder is what it expects.
    """
    import llguidance

    spec = json.loads(tok.backend_tokenizer.to_str())
    decoder = spec.get("decoder") or {}
    if decoder.get("type") == "Sequence" and any(d.get("type") == "ByteLevel" for d in decoder.get("decoders", [])):
        spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return llguidance.LLTokenizer(json.dumps(spec), n_vocab=vocab_size, eos_token=eos_ids or None)
