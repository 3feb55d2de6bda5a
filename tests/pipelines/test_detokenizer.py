"""Incremental detokenizing: split UTF-8 characters and stop strings across tokens."""

from __future__ import annotations

from pipelines.detokenizer import IncrementalDetokenizer

# A byte-level toy vocabulary: token i is byte i, so multi-byte characters span tokens.


def _decode(ids) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def _feed(det: IncrementalDetokenizer, text: str) -> tuple[str, bool]:
    out, stopped = [], False
    for b in text.encode("utf-8"):
        r = det.add(b)
        out.append(r.delta)
        if r.stopped:
            stopped = True
            break
    return "".join(out), stopped


def test_multibyte_characters_are_released_whole() -> None:
    det = IncrementalDetokenizer(_decode)
    deltas = [det.add(b).delta for b in "é€".encode("utf-8")]
    assert deltas == ["", "é", "", "", "€"]


def test_stop_string_across_tokens_cuts_the_text() -> None:
    det = IncrementalDetokenizer(_decode, stop=("STOP",))
    text, stopped = _feed(det, "hello STOP world")
    assert stopped and text == "hello " and det.text == "hello "


def test_text_that_might_start_a_stop_string_is_held_then_released() -> None:
    det = IncrementalDetokenizer(_decode, stop=("STOP",))
    text, stopped = _feed(det, "a STO")
    assert not stopped and text == "a "  # "STO" could still become STOP
    assert det.flush() == "STO"
    assert det.text == "a STO"
