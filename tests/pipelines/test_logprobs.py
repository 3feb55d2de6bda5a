"""Token logprobs and their OpenAI shapes (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipelines.logprobs import TokenLogprob, token_logprob
from pipelines.sampling import SamplingError, SamplingParams
from serve.protocol import APIError, logprobs_object, parse_request

LOGITS = np.array([0.1, 3.0, 2.9, -1.0, 3.0, 2.0], dtype=np.float32)


def test_logprob_is_the_log_softmax_and_top_is_ordered() -> None:
    z = [float(v) for v in LOGITS]
    log_total = math.log(sum(math.exp(v) for v in z))
    rec = token_logprob(LOGITS, 2, 3)
    assert rec.token_id == 2
    assert rec.logprob == pytest.approx(z[2] - log_total, abs=1e-12)
    # 1 and 4 tie: the lower id comes first.
    assert [i for i, _ in rec.top] == [1, 4, 2]
    assert [lp for _, lp in rec.top] == pytest.approx([z[1] - log_total, z[4] - log_total, z[2] - log_total])
    assert sum(math.exp(token_logprob(LOGITS, i, 0).logprob) for i in range(len(z))) == pytest.approx(1.0)
    assert token_logprob(LOGITS, 0, 0).top == ()
    assert len(token_logprob(LOGITS, 0, 20).top) == len(z)


def test_huge_logits_stay_finite() -> None:
    rec = token_logprob(np.array([1e30, 0.0, -1e30], dtype=np.float32), 0, 2)
    assert rec.logprob == 0.0 and math.isfinite(rec.top[1][1])


def _chat(**extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_request_options() -> None:
    assert parse_request(_chat(), "chat", 100).params.logprobs is None
    assert parse_request(_chat(logprobs=True), "chat", 100).params.logprobs == 0
    assert parse_request(_chat(logprobs=True, top_logprobs=7), "chat", 100).params.logprobs == 7
    assert parse_request({"model": "m", "prompt": "x", "logprobs": 3}, "completion", 100).params.logprobs == 3
    for body, kind, param in [(_chat(top_logprobs=2), "chat", "top_logprobs"),
                              (_chat(logprobs=True, top_logprobs=21), "chat", "top_logprobs"),
                              (_chat(logprobs=1), "chat", "logprobs"),
                              ({"model": "m", "prompt": "x", "logprobs": 6}, "completion", "logprobs")]:
        with pytest.raises(APIError) as err:
            parse_request(body, kind, 100)
        assert err.value.status == 400 and err.value.param == param
    with pytest.raises(SamplingError):
        SamplingParams(logprobs=21)


def test_response_shapes() -> None:
    entries = [token_logprob(LOGITS, 1, 2), token_logprob(LOGITS, 5, 2)]
    text = {1: "ab", 4: "é", 5: "c"}.get
    chat = logprobs_object("chat", entries, text)
    assert [c["token"] for c in chat["content"]] == ["ab", "c"]
    assert chat["content"][0]["bytes"] == [97, 98]
    assert [t["token"] for t in chat["content"][1]["top_logprobs"]] == ["ab", "é"]
    assert chat["content"][1]["top_logprobs"][1]["bytes"] == list("é".encode())
    comp = logprobs_object("completion", entries, text, text_offset=5)
    assert comp["tokens"] == ["ab", "c"] and comp["text_offset"] == [5, 7]
    assert comp["token_logprobs"] == [entries[0].logprob, entries[1].logprob]
    assert list(comp["top_logprobs"][0]) == ["ab", "é"]


def test_text_offset_skips_tokens_the_text_leaves_out() -> None:
    # An echoed raw prompt that starts with <bos> (Gemma): the text drops it (skip_special_tokens), so
    # the offsets must not count it; the token itself is still reported.
    entries = [2, token_logprob(LOGITS, 1, 2), token_logprob(LOGITS, 5, 2)]
    text = {1: "ab", 2: "<bos>", 5: "c"}.get
    shown = {1: "ab", 2: "", 5: "c"}.get
    comp = logprobs_object("completion", entries, text, shown=shown)
    assert comp["tokens"] == ["<bos>", "ab", "c"] and comp["text_offset"] == [0, 0, 2]


def test_split_characters_report_their_bytes_and_count_once_in_offsets() -> None:
    """SmolLM2's tokenizer splits 🙂 and 日本語 over several tokens, each decoding alone to U+FFFD: `bytes`
    are the token's own (joined, they rebuild the text) and text_offset counts a character once, so
    every offset indexes the echoed text (they once drifted by a character per split token)."""
    from crucible.core.registry import resolve_model
    from crucible.core.tokenizer import TokenBytes, load_tokenizer
    from serve.protocol import TextOffsets

    tok = load_tokenizer(resolve_model("smollm2-135m"))
    text = "héllo 日本語 🙂 ok"
    ids = tok.encode(text, add_special_tokens=False)
    entries = [TokenLogprob(i, -1.0, ()) for i in ids]
    token_text = lambda i: tok.decode([i])  # noqa: E731
    raw = TokenBytes(tok)
    chat = logprobs_object("chat", entries, token_text, raw=raw)["content"]
    assert any(c["token"] == "\ufffd" for c in chat)                      # the case this is about
    assert bytes(b for c in chat for b in c["bytes"]).decode("utf-8") == text
    comp = logprobs_object("completion", entries, token_text, shown=token_text, raw=raw, offsets=TextOffsets())
    for i, at in enumerate(comp["text_offset"]):
        whole = b"".join(raw(t) for t in ids[:i + 1]).decode("utf-8", errors="ignore")
        assert text.startswith(whole) and len(whole) >= at
    assert comp["text_offset"][-1] == text.index(" ok")
    # Control: without the bytes the offsets count every split token as a character and overshoot.
    old = logprobs_object("completion", entries, token_text, shown=token_text)["text_offset"]
    assert old[-1] > text.index(" ok")


def test_token_bytes_follow_the_decoder() -> None:
    """A literal "<0x0A>" piece in a byte-level vocabulary is its six characters (no ByteFallback there),
    and an added token is its own text."""
    from crucible.core.tokenizer import TokenBytes

    class Decoder:
        def __repr__(self) -> str:
            return "ByteLevel(add_prefix_space=True)"

    class Tok:
        backend_tokenizer = type("B", (), {"decoder": Decoder()})()

        def get_added_vocab(self) -> dict[str, int]:
            return {"<café>": 7}

        def convert_ids_to_tokens(self, i: int) -> str:
            return {1: "<0x0A>", 2: "ĠhÃ©", 7: "<café>"}[i]

    raw = TokenBytes(Tok())
    assert (raw(1), raw(2), raw(7)) == (b"<0x0A>", " hé".encode(), "<café>".encode())
