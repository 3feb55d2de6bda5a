"""Incremental detokenizing with stop strings: turns a growing list of token ids into text deltas.

Two things make this more than `decode`: a token can end in the middle of a multi-byte UTF-8 character
(decoding then shows U+FFFD until the next token completes it), and a stop string can span tokens, so
text that might be the start of a stop string is held back until it is known not to be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

REPLACEMENT = "\ufffd"


@dataclass
class DetokenizeResult:
    """What one new token adds.

    Attributes:
        delta: Text that can be shown now.
        stopped: A stop string was found; the text ends before it.
    """

    delta: str
    stopped: bool


class IncrementalDetokenizer:
    """Tracks one sequence's text.

    Args:
        decode: ids -> text (special tokens skipped), e.g. a bound tokenizer.decode.
        stop: Stop strings.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""  # text emitted so far
        self.stopped = False

    def add(self, token_id: int) -> DetokenizeResult:
        """Appends one generated token and returns the text it releases."""
        if self.stopped:
            return DetokenizeResult("", True)
        self.ids.append(token_id)
        full = self._decode(self.ids)
        if full.endswith(REPLACEMENT):
            return DetokenizeResult("", False)  # wait for the rest of the character
        search_from = max(0, len(self.text) - self._hold)
        cut = min((i for i in (full.find(s, search_from) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            delta = full[len(self.text):cut] if cut > len(self.text) else ""
            self.text += delta
            return DetokenizeResult(delta, True)
        safe_end = len(full) - self._hold if self._stop else len(full)
        safe_end = max(safe_end, len(self.text))
        delta = full[len(self.text):safe_end]
        self.text += delta
        return DetokenizeResult(delta, False)

    def flush(self) -> str:
        """Releases text held back for stop-string matching when the sequence ends another way."""
        if self.stopped:
            return ""
        full = self._decode(self.ids).rstrip(REPLACEMENT)
        delta = full[len(self.text):]
        self.text += delta
        return delta
