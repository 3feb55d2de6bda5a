"""OpenAI request validation and response shapes, independent of the web framework (testable alone).

Requests are parsed from the raw JSON body so every malformed input becomes an OpenAI-style error
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx status, never a 500.
"""

from __future__ import annotations

import codecs
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pipelines import openai_request
from pipelines.logprobs import TokenLogprob
from pipelines.openai_request import GenerationRequest, RequestError


class APIError(Exception):
    """An error the API reports to the client in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse_request(body: Any, kind: str, max_context: int) -> GenerationRequest:
    """Validates a /v1/chat/completions (kind "chat") or /v1/completions (kind "completion") body
    (pipelines/openai_request.py, shared with batch rows and the Python API).

    Raises:
        APIError: 400 with the offending parameter named.
    """
    try:
        return openai_request.parse_request(body, kind, max_context)
    except RequestError as exc:
        raise APIError(400, str(exc), param=exc.param, code=exc.code) from exc


class TextOffsets:
    """Characters of text before each token of a sequence (completions' text_offset), counted from the
    tokens' bytes: a character split over several tokens counts once, at the token that completes it."""

    def __init__(self, start: int = 0) -> None:
        self.offset = start
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, raw: bytes) -> int:
        """The offset of a token with bytes `raw`, then moves past it."""
        at = self.offset
        self.offset += len(self._utf8.decode(raw))
        return at


def logprobs_object(kind: str, entries: Sequence[TokenLogprob | int], token_text: Callable[[int], str],
                    text_offset: int = 0, shown: Callable[[int], str] | None = None,
                    raw: Callable[[int], bytes] | None = None, offsets: TextOffsets | None = None) -> dict[str, Any]:
    """The `logprobs` field of a choice for these tokens.

    Args:
        kind: "chat" ({"content": [{token, logprob, bytes, top_logprobs}]}) or "completion"
            ({tokens, token_logprobs, top_logprobs, text_offset}).
        entries: The tokens, in order; a bare token id is a token without a logprob (the first prompt
            token under echo), reported as null.
        token_text: Text of one token id.
        text_offset: Characters of text before the first entry (completions only, without `offsets`).
        shown: The token's text as the choice's text shows it (special tokens such as a prompt's <bos>
            are left out of it), for text_offset; token_text when None.
        raw: The bytes of one token id (crucible.core.tokenizer.token_bytes): chat's `bytes`, and with
            `offsets` the text offsets; without it, the UTF-8 of token_text.
        offsets: The sequence's running text offsets, advanced past these entries (completions, with raw).
    """
    if kind == "chat":
        def one(token_id: int, logprob: float) -> dict[str, Any]:
            text = token_text(token_id)
            return {"token": text, "logprob": logprob,
                    "bytes": list(raw(token_id) if raw is not None else text.encode("utf-8"))}

        return {"content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]}
                            for e in entries if isinstance(e, TokenLogprob)]}
    tokens, at, values, tops = [], [], [], []
    for e in entries:
        token_id = e if isinstance(e, int) else e.token_id
        tokens.append(token_text(token_id))
        visible = tokens[-1] if shown is None else shown(token_id)
        if offsets is not None and raw is not None:
            at.append(offsets.advance(raw(token_id)) if visible else offsets.offset)
        else:
            at.append(text_offset)
            text_offset += len(visible)
        values.append(None if isinstance(e, int) else e.logprob)
        tops.append(None if isinstance(e, int) else {token_text(i): lp for i, lp in e.top})
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": at}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; `prompt_tokens_details.cached_tokens` counts prompt tokens whose KV pages
    came from the prefix cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def envelope(req: GenerationRequest, rid: str, model: str, fingerprint: str, choices: list[dict[str, Any]],
             stream: bool = False) -> dict[str, Any]:
    """A chat.completion(.chunk) or text_completion object around its choices."""
    obj = ("chat.completion.chunk" if stream else "chat.completion") if req.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": choices,
            "system_fingerprint": fingerprint}
