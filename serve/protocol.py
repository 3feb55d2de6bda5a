"""OpenAI request validation and response shapes, independent of the web framework (testable alone).

Requests are parsed from the raw JSON body so every malformed input becomes an OpenAI-style error
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx status, never a 500.
"""

from __future__ import annotations

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


def logprobs_object(kind: str, entries: Sequence[TokenLogprob | int], token_text: Callable[[int], str],
                    text_offset: int = 0, shown: Callable[[int], str] | None = None) -> dict[str, Any]:
    """The `logprobs` field of a choice for these tokens.

    Args:
        kind: "chat" ({"content": [{token, logprob, bytes, top_logprobs}]}) or "completion"
            ({tokens, token_logprobs, top_logprobs, text_offset}).
        entries: The tokens, in order; a bare token id is a token without a logprob (the first prompt
            token under echo), reported as null.
        token_text: Text of one token id.
        text_offset: Characters of text before the first entry (completions only).
        shown: The token's text as the choice's text shows it (special tokens such as a prompt's <bos>
            are left out of it), for text_offset; token_text when None.
    """
    if kind == "chat":
        def one(token_id: int, logprob: float) -> dict[str, Any]:
            text = token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {"content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]}
                            for e in entries if isinstance(e, TokenLogprob)]}
    tokens, offsets, values, tops = [], [], [], []
    for e in entries:
        token_id = e if isinstance(e, int) else e.token_id
        tokens.append(token_text(token_id))
        offsets.append(text_offset)
        text_offset += len(tokens[-1] if shown is None else shown(token_id))
        values.append(None if isinstance(e, int) else e.logprob)
        tops.append(None if isinstance(e, int) else {token_text(i): lp for i, lp in e.top})
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


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
