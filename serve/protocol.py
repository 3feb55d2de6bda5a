"""OpenAI request validation and response shapes, independent of the web framework (testable alone).

Requests are parsed from the raw JSON body so every malformed input becomes an OpenAI-style error
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx status, never a 500.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.logprobs import TokenLogprob
from pipelines.sampling import DEFAULT_MAX_TOKENS, SEED_MAX, SEED_MIN, SamplingError, SamplingParams

ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """An error the API reports to the client in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    """A validated chat or completion request.

    Attributes:
        kind: "chat" or "completion".
        model: The model name the client asked for.
        messages: Chat messages (chat) or None.
        prompt: Raw prompt text (completion) or None.
        params: Sampling; max_tokens None means "up to the context" (resolved once the prompt is tokenized).
        max_tokens_given: Whether the client set max_tokens.
        stream: Server-sent events.
        include_usage: stream_options.include_usage.
    """

    kind: str
    model: str
    messages: list[dict[str, str]] | None
    prompt: str | None
    params: SamplingParams
    max_tokens_given: bool
    stream: bool
    include_usage: bool


def _type_error(param: str, expected: str) -> APIError:
    return APIError(400, f"'{param}' must be {expected}", param=param, code="invalid_type")


def _number(body: dict, name: str, default: float | None, lo: float, hi: float) -> float | None:
    if name not in body or body[name] is None:
        return default
    v = body[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _type_error(name, "a number")
    if not lo <= v <= hi:
        raise APIError(400, f"'{name}' must be between {lo} and {hi}, got {v}", param=name, code="invalid_value")
    return float(v)


def _int(body: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    if name not in body or body[name] is None:
        return default
    v = body[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise _type_error(name, "an integer")
    if not lo <= v <= hi:
        raise APIError(400, f"'{name}' must be between {lo} and {hi}, got {v}", param=name, code="invalid_value")
    return v


# OpenAI fields the server does not implement yet. A value that asks for nothing (null, 0, an empty
# list or map, response_format "text", tool_choice "none") is accepted, since SDKs send such defaults;
# anything else is a 400 that names the field, never silently ignored.
_UNIMPLEMENTED = {
    "tools": lambda v: v in (None, []),
    "tool_choice": lambda v: v in (None, "none"),
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none"),
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
    "presence_penalty": lambda v: v is None or (_is_plain_number(v) and v == 0),
    "frequency_penalty": lambda v: v is None or (_is_plain_number(v) and v == 0),
    "repetition_penalty": lambda v: v is None or (_is_plain_number(v) and v == 1),
    "min_p": lambda v: v is None or (_is_plain_number(v) and v == 0),
    "logit_bias": lambda v: v in (None, {}),
    "best_of": lambda v: v is None or (_is_plain_number(v) and v == 1),
    "suffix": lambda v: v in (None, ""),
}


def _is_plain_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _refuse_unimplemented(body: dict) -> None:
    for name, neutral in _UNIMPLEMENTED.items():
        if name in body and not neutral(body[name]):
            raise APIError(400, f"'{name}' is not supported by this server yet", param=name, code="unsupported")


def _bool(body: dict, name: str, default: bool, param: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise _type_error(param or name, "a boolean")
    return v


def _unencodable(body: Any) -> str | None:
    """The path of the first string (key or value) that UTF-8 cannot encode, e.g. a lone surrogate
    such as "\\ud800", which JSON allows and the tokenizer refuses. Iterative: bodies nest deeply."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        path, obj = stack.pop()
        if isinstance(obj, str):
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(obj, dict):
            for key, value in obj.items():
                if _unencodable(key) is not None:
                    return path or "body"
                stack.append((f"{path}.{key}" if path else key, value))
        elif isinstance(obj, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
    return None


def parse_request(body: Any, kind: str, max_context: int) -> GenerationRequest:
    """Validates a /v1/chat/completions (kind "chat") or /v1/completions (kind "completion") body.

    Raises:
        APIError: 400 with the offending parameter named.
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    bad = _unencodable(body)
    if bad is not None:
        raise APIError(400, f"'{bad}' holds a lone surrogate, which is not valid Unicode text", param=bad,
                       code="invalid_value")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' is required and must be a string", param="model", code="invalid_type")
    messages = prompt = None
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError(400, "'messages' must be a non-empty array", param="messages", code="invalid_value")
        clean = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _type_error(f"messages[{i}]", "an object")
            role, content = m.get("role"), m.get("content")
            if role not in ROLES:
                raise APIError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                               param=f"messages[{i}].role", code="invalid_value")
            if isinstance(content, list):  # OpenAI content parts: only text is supported
                if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                           for p in content):
                    raise APIError(400, f"messages[{i}].content: only text parts are supported",
                                   param=f"messages[{i}].content", code="invalid_value")
                content = "".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise _type_error(f"messages[{i}].content", "a string")
            # OpenAI's newer name for system instructions; chat templates know only "system".
            clean.append({"role": "system" if role == "developer" else role, "content": content})
        messages = clean
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise APIError(400, "'prompt' must be a non-empty string", param="prompt", code="invalid_value")
        if body.get("echo"):
            raise APIError(400, "'echo' is not supported", param="echo", code="unsupported")
    _refuse_unimplemented(body)
    n = _int(body, "n", 1, 1, 128)
    if n != 1:
        raise APIError(400, "only n=1 is supported", param="n", code="unsupported")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _type_error("stream", "a boolean")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise _type_error("stream_options", "an object")
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = tuple(stop)
    else:
        raise _type_error("stop", "a string or an array of strings")
    max_tokens = _int(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens",
                      None, 1, max_context)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise APIError(400, "'top_p' must be greater than 0", param="top_p", code="invalid_value")
    logprobs = _logprobs_option(body, kind)
    try:
        params = SamplingParams(
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=top_p,
            top_k=_int(body, "top_k", 0, 0, 1_000_000),
            seed=_int(body, "seed", None, SEED_MIN, SEED_MAX),
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
            stop=stop,
            ignore_eos=_bool(body, "ignore_eos", False),
            logprobs=logprobs,
        )
    except SamplingError as exc:
        raise APIError(400, str(exc), param=exc.param, code="invalid_value") from exc
    return GenerationRequest(kind, model, messages, prompt, params, max_tokens is not None, stream,
                             _bool(opts, "include_usage", False, "stream_options.include_usage"))


def _logprobs_option(body: dict, kind: str) -> int | None:
    """Alternatives per token to report, or None: chat takes `logprobs: bool` with `top_logprobs`
    (0-20), completions take `logprobs: int` (0-5), as OpenAI's API does."""
    if kind == "completion":
        return _int(body, "logprobs", None, 0, 5)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise _type_error("logprobs", "a boolean")
    top = _int(body, "top_logprobs", None, 0, 20)
    if top is not None and not wanted:
        raise APIError(400, "'top_logprobs' requires 'logprobs' to be true", param="top_logprobs",
                       code="invalid_value")
    return (top or 0) if wanted else None


def logprobs_object(kind: str, entries: Sequence[TokenLogprob], token_text: Callable[[int], str],
                    text_offset: int = 0) -> dict[str, Any]:
    """The `logprobs` field of a choice for these generated tokens.

    Args:
        kind: "chat" ({"content": [{token, logprob, bytes, top_logprobs}]}) or "completion"
            ({tokens, token_logprobs, top_logprobs, text_offset}).
        entries: The tokens, in order.
        token_text: Text of one token id.
        text_offset: Characters of completion text before the first entry (completions only).
    """
    if kind == "chat":
        def one(token_id: int, logprob: float) -> dict[str, Any]:
            text = token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {"content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]}
                            for e in entries]}
    tokens, offsets = [], []
    for e in entries:
        tokens.append(token_text(e.token_id))
        offsets.append(text_offset)
        text_offset += len(tokens[-1])
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(i): lp for i, lp in e.top} for e in entries], "text_offset": offsets}


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def full_response(req: GenerationRequest, rid: str, model: str, text: str, finish_reason: str,
                  prompt_tokens: int, completion_tokens: int, fingerprint: str,
                  logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """A non-streaming chat.completion or text_completion object (`logprobs`: see logprobs_object)."""
    reason = "stop" if finish_reason == "stop" else "length" if finish_reason == "length" else finish_reason
    if req.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                  "logprobs": logprobs}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": logprobs}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens), "system_fingerprint": fingerprint}


def stream_chunk(req: GenerationRequest, rid: str, model: str, text: str | None, finish_reason: str | None,
                 fingerprint: str, first: bool = False, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One SSE chunk (chat.completion.chunk or text_completion)."""
    if req.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": logprobs}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish_reason, "logprobs": logprobs}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice],
            "system_fingerprint": fingerprint}
