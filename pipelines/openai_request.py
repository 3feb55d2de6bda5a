"""OpenAI request bodies, validated once for every entry point: the HTTP API, batch rows, the Python API.

`parse_request` turns a /v1/chat/completions or /v1/completions body into a `GenerationRequest`, or
raises `RequestError` naming the offending parameter. Every field is either implemented, neutral (a
default an SDK sends, such as `tool_choice: "none"`), one of OpenAI's metadata fields that do not
change the output (`IGNORED`), or refused: an unknown field is an error, never silently dropped.
`encode_request` turns a parsed request into prompt token ids, tools included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.grammar import Grammar
from pipelines.openai_fields import (RequestError, boolean, integer, logit_bias_pairs, logprobs_option, number,
                                     response_format, stop_strings, token_ids, type_error, unencodable_path)
from pipelines.openai_messages import ROLES, read_messages, read_prompts, refuse_legacy, tools_and_choice
from pipelines.sampling import DEFAULT_MAX_TOKENS, MAX_N, SEED_MAX, SEED_MIN, SamplingError, SamplingParams
from pipelines.tools import ToolCall, parse_tool_calls, special_tag_ids, tools_grammar, tools_messages

__all__ = ["FIELDS", "IGNORED", "ROLES", "GenerationRequest", "RequestError", "encode_request", "final_output",
           "parse_request", "prompt_jobs"]

# OpenAI's metadata fields: accepted and not used (they do not change what is generated).
IGNORED = ("user", "metadata", "store")
_COMMON = {"model", "stream", "stream_options", "stop", "max_tokens", "max_completion_tokens", "temperature",
           "top_p", "top_k", "min_p", "n", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
           "logit_bias", "logprobs", "ignore_eos", "stop_token_ids", "response_format", *IGNORED}
FIELDS = {
    "chat": _COMMON | {"messages", "top_logprobs", "tools", "tool_choice",
                       "parallel_tool_calls", "functions", "function_call"},
    "completion": _COMMON | {"prompt", "echo", "best_of", "suffix"},
}


@dataclass(frozen=True)
class GenerationRequest:
    """A validated chat or completion request.

    Attributes:
        kind: "chat" or "completion".
        model: The model the client asked for ("" when the entry point has no model field).
        messages: Normalized chat messages (chat) or None.
        prompts: Completion prompts, each text or token ids (completion) or None.
        params: Sampling; max_tokens is the default when not given (see max_tokens_given).
        max_tokens_given: Whether the client set max_tokens.
        stream: Server-sent events.
        include_usage: stream_options.include_usage.
        echo: Completions: the prompt is returned before the completion (its logprobs too when asked).
        tools: OpenAI tool definitions, or None.
        tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.
        parallel_tool_calls: Several calls allowed.
        answer: response_format's grammar, or None (params.grammar may combine it with the tools').
    """

    kind: str
    model: str
    messages: list[dict[str, Any]] | None
    prompts: list[str | list[int]] | None
    params: SamplingParams
    max_tokens_given: bool
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "none"
    parallel_tool_calls: bool = True
    answer: Grammar | None = None

    @property
    def tool_names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools or ()}

    @property
    def forces_tool_calls(self) -> bool:
        """Whether a grammar holds the output to tool calls (tool_choice required or a named function)."""
        return bool(self.tools) and (self.tool_choice == "required" or isinstance(self.tool_choice, dict))

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the output is read for tool calls (tools given and tool_choice is not "none")."""
        return bool(self.tools) and self.tool_choice != "none"


def _metadata_fields(body: dict) -> None:
    """The IGNORED fields are not used, but still typed as OpenAI types them: user a string, metadata an
    object of strings, store a boolean."""
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise type_error("user", "a string")
    meta = body.get("metadata")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise type_error("metadata", "an object of strings")
    boolean(body, "store", False)


def parse_request(body: Any, kind: str, max_context: int, require_model: bool = True,
                  extra_fields: frozenset[str] = frozenset()) -> GenerationRequest:
    """Validates a chat (kind "chat") or completion (kind "completion") request body.

    Args:
        body: The decoded JSON body.
        kind: "chat" or "completion".
        max_context: Tokens one sequence may hold (bounds max_tokens).
        require_model: Whether `model` must be given (the HTTP API; batch rows have none).
        extra_fields: Fields the entry point handles itself (a batch row's "id").

    Raises:
        RequestError: The first problem, with the parameter named.
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    bad = unencodable_path(body)
    if bad is not None:
        raise RequestError(f"'{bad}' holds a lone surrogate, which is not valid Unicode text", bad)
    unknown = sorted(set(body) - FIELDS[kind] - extra_fields)
    if unknown:
        raise RequestError(f"unrecognized request argument: '{unknown[0]}'", unknown[0], "unknown_parameter")
    model = body.get("model", "")
    if (require_model or "model" in body) and (not isinstance(model, str) or not model):
        raise RequestError("'model' is required and must be a string", "model", "invalid_type")
    refuse_legacy(body)
    tools, choice = tools_and_choice(body) if kind == "chat" else (None, "none")
    messages = read_messages(body.get("messages")) if kind == "chat" else None
    prompts = read_prompts(body.get("prompt")) if kind == "completion" else None
    stream = boolean(body, "stream", False)
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise type_error("stream_options", "an object")
    if opts and not stream:
        raise RequestError("'stream_options' is only allowed when 'stream' is true", "stream_options",
                           "invalid_value")
    _metadata_fields(body)
    # include_obfuscation pads chunks against length side channels; this server sends no padding
    extra = sorted(set(opts) - {"include_usage", "include_obfuscation"})
    if extra:
        raise RequestError(f"unrecognized request argument: 'stream_options.{extra[0]}'",
                           f"stream_options.{extra[0]}", "unknown_parameter")
    echo = boolean(body, "echo", False)
    max_key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = integer(body, max_key, None, 0 if echo else 1, max_context)
    n = integer(body, "n", 1, 1, MAX_N)
    best_of = integer(body, "best_of", None, 1, MAX_N)
    if best_of is not None and best_of != n:
        raise RequestError("'best_of' other than n is not supported (no ranking of sequences)", "best_of",
                           "unsupported")
    if body.get("suffix") not in (None, ""):
        raise RequestError("'suffix' is not supported (no fill-in-the-middle)", "suffix", "unsupported")
    logprobs = logprobs_option(body, kind)
    answer = response_format(body.get("response_format"))
    parallel = boolean(body, "parallel_tool_calls", True)
    if tools and answer is not None and (choice == "required" or isinstance(choice, dict)):
        raise RequestError("'response_format' cannot be combined with a required or named tool_choice",
                           "response_format", "invalid_value")
    # Under auto the answer is either tool calls or the response_format (pipelines/tools.py).
    grammar = (tools_grammar(tools, choice, parallel, answer) if tools else None) or answer
    top_p = number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise RequestError("'top_p' must be greater than 0", "top_p")
    try:
        params = SamplingParams(
            temperature=number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=top_p,
            top_k=max(0, integer(body, "top_k", 0, -1, 1_000_000)),  # -1: vLLM's "off", as 0 here
            seed=integer(body, "seed", None, SEED_MIN, SEED_MAX),
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            stop=stop_strings(body.get("stop")),
            stop_token_ids=token_ids(body, "stop_token_ids"),
            ignore_eos=boolean(body, "ignore_eos", False),
            logprobs=logprobs,
            presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            repetition_penalty=number(body, "repetition_penalty", 1.0, 0.0, 100.0),
            min_p=number(body, "min_p", 0.0, 0.0, 1.0),
            logit_bias=logit_bias_pairs(body.get("logit_bias")),
            n=n,
            # echo with max_tokens 0 returns the prompt alone: it runs as a prompt-logprobs request
            prompt_logprobs=(logprobs if logprobs is not None else 0) if echo and (logprobs is not None or
                                                                                 max_tokens == 0) else None,
            grammar=grammar,
        )
    except SamplingError as exc:
        raise RequestError(str(exc), exc.param) from exc
    if max_tokens == 0 and not echo:
        raise RequestError(f"'{max_key}' may be 0 only with echo", max_key)
    return GenerationRequest(kind, model, messages, prompts, params, max_tokens is not None, stream,
                             boolean(opts, "include_usage", False, "stream_options.include_usage"), echo, tools, choice,
                             parallel, answer)


def encode_request(tokenizer: Any, req: GenerationRequest) -> list[list[int]]:
    """The prompt token ids of a parsed request: one list per completion prompt, or one for a chat.

    Chats go through the model's chat template, with the tools when tool_choice is not "none"
    (pipelines/tools.py); text prompts are tokenized as they are; token-id prompts are taken as given.
    """
    from crucible.core.tokenizer import encode_prompt

    if req.kind == "chat":
        messages, tools = tools_messages(tokenizer, req.messages or [],
                                         req.tools if req.parses_tool_calls else None)
        if tools is None:
            return [encode_prompt(tokenizer, messages)]
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return [list(tokenizer(text, add_special_tokens=False)["input_ids"])]
    return [p if isinstance(p, list) else encode_prompt(tokenizer, p, chat=False) for p in req.prompts or []]


def final_output(req: GenerationRequest, text: str, finish_reason: str | None) -> tuple[str, list[ToolCall], str]:
    """A finished sequence as the client sees it: (content, tool calls, finish reason), where a
    sequence that ends with tool calls finishes with "tool_calls"."""
    calls: list[ToolCall] = []
    if req.kind == "chat" and req.parses_tool_calls:
        text, calls = parse_tool_calls(text, req.tool_names)
        if req.forces_tool_calls:
            # The grammar allows nothing but calls: what is left is a call cut off by max_tokens.
            text = ""
    reason = finish_reason or "error"
    return text, calls, ("tool_calls" if calls and reason == "stop" else reason)


def prompt_jobs(tokenizer: Any, req: GenerationRequest, max_seq_len: int) -> list[tuple[list[int], SamplingParams]]:
    """Each prompt of a parsed request, tokenized, with its sampling: without max_tokens a sequence may
    run up to the context (capped by the default).

    Returns:
        [(prompt ids, params)] in prompt order.
    """
    from dataclasses import replace

    base = req.params
    special = special_tag_ids(tokenizer) if req.tools else {}
    if special and req.tool_choice != "none":  # the tags are tokens of this tokenizer: name them so
        base = replace(base, grammar=tools_grammar(req.tools, req.tool_choice, req.parallel_tool_calls, req.answer,
                                                   special) or req.answer)
    out = []
    for ids in encode_request(tokenizer, req):
        params = base
        if not req.max_tokens_given:
            params = replace(params, max_tokens=max(1, min(params.max_tokens, max_seq_len - len(ids))))
        out.append((ids, params))
    return out


