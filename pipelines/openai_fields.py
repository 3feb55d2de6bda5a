"""Readers of single OpenAI request fields: each returns the field's value or its default, or raises
RequestError naming the field (pipelines/openai_request.py puts them together)."""

from __future__ import annotations

from typing import Any

from pipelines.grammar import Grammar, GrammarError
from pipelines.logprobs import MAX_TOP_LOGPROBS


class RequestError(ValueError):
    """A request field that is missing, malformed, out of range or not supported.

    Attributes:
        param: The field's path, e.g. "messages[1].content".
        code: "invalid_type", "invalid_value", "unsupported" or "unknown_parameter".
    """

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def unencodable_path(body: Any) -> str | None:
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
                if unencodable_path(key) is not None:
                    return path or "body"
                stack.append((f"{path}.{key}" if path else key, value))
        elif isinstance(obj, list):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(obj))
    return None


def type_error(param: str, expected: str) -> RequestError:
    return RequestError(f"'{param}' must be {expected}", param, "invalid_type")


def is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    if body.get(name) is None:
        return default
    v = body[name]
    if not is_number(v):
        raise type_error(name, "a number")
    if not lo <= v <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return float(v)


def integer(body: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    if body.get(name) is None:
        return default
    v = body[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise type_error(name, "an integer")
    if not lo <= v <= hi:
        raise RequestError(f"'{name}' must be between {lo} and {hi}, got {v}", name)
    return v


def boolean(body: dict, name: str, default: bool, param: str | None = None) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise type_error(param or name, "a boolean")
    return v


def stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise type_error("stop", "a string or an array of strings")


def token_ids(body: dict, name: str) -> tuple[int, ...]:
    v = body.get(name)
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in v):
        raise type_error(name, "an array of token ids")
    return tuple(v)


def logit_bias_pairs(bias: Any) -> tuple[tuple[int, float], ...]:
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise type_error("logit_bias", "an object mapping token ids to numbers")
    pairs = []
    for key, value in bias.items():
        # str.isdigit() also takes "²" and Arabic-Indic digits, which int() refuses or reads as other ids
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) and not (
                isinstance(key, int) and not isinstance(key, bool)):
            raise RequestError(f"'logit_bias' keys must be token ids, got {key!r}", "logit_bias")
        if not is_number(value) or not -100 <= value <= 100:
            raise RequestError(f"'logit_bias' values must be numbers in [-100, 100], got {value!r}", "logit_bias")
        pairs.append((int(key), float(value)))
    return tuple(sorted(pairs))


def logprobs_option(body: dict, kind: str) -> int | None:
    """Alternatives per token to report, or None: chat takes `logprobs: bool` with `top_logprobs`
    (0-20), completions take `logprobs: int` (0-5), as OpenAI's API does."""
    if kind == "completion":
        return integer(body, "logprobs", None, 0, 5)
    wanted = body.get("logprobs")
    if wanted is not None and not isinstance(wanted, bool):
        raise type_error("logprobs", "a boolean")
    top = integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not wanted:
        raise RequestError("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    return (top or 0) if wanted else None


# The keys OpenAI defines for each response_format type (json_schema's strict: the grammar always holds
# the output to the schema).
_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}


def unknown_keys(obj: dict, known: set[str], at: str) -> None:
    """Raises RequestError naming the first key of `obj` (an object at parameter `at`) not in `known`."""
    extra = sorted(k for k in obj if k not in known)
    if extra:
        raise RequestError(f"unrecognized request argument: '{at}.{extra[0]}'", f"{at}.{extra[0]}",
                           "unknown_parameter")


def response_format(fmt: Any) -> Grammar | None:
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise type_error("response_format", "an object")
    kind = fmt.get("type")
    if kind in _FORMAT_KEYS:
        unknown_keys(fmt, _FORMAT_KEYS[kind], "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar("json_object")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            param = "response_format.json_schema" + (".schema" if isinstance(spec, dict) else "")
            raise RequestError("'response_format.json_schema' must be an object with a 'schema' object",
                               param, "invalid_type")
        unknown_keys(spec, {"name", "description", "schema", "strict"}, "response_format.json_schema")
        try:
            return Grammar.json_schema(spec.get("schema") or {"type": "object"})
        except GrammarError as exc:
            raise RequestError(str(exc), "response_format.json_schema.schema") from None
    raise RequestError(f"'response_format.type' must be text, json_object or json_schema, got {kind!r}",
                       "response_format.type")
