"""Readers of the structured parts of an OpenAI request: chat messages (tool turns included), tools and
tool_choice, and completion prompts in every form OpenAI takes."""

from __future__ import annotations

import json
from typing import Any

from pipelines.openai_fields import RequestError, type_error, unknown_keys

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_PROMPTS = 2048  # completion prompts in one request, OpenAI's bound
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id"}
# Keys an SDK copies back from a response message (`messages.append(choice.message)`): accepted as null.
_NULL_MESSAGE_KEYS = {"refusal", "audio", "annotations", "function_call", "reasoning_content"}



def refuse_legacy(body: dict) -> None:
    if body.get("functions") not in (None, []) or body.get("function_call") not in (None, "none"):
        param = "functions" if body.get("functions") not in (None, []) else "function_call"
        raise RequestError(f"'{param}' is deprecated and not supported; use 'tools' and 'tool_choice'", param,
                           "unsupported")


def tools_and_choice(body: dict) -> tuple[list[dict[str, Any]] | None, str | dict[str, Any]]:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none", "auto"):
            raise RequestError("'tool_choice' needs 'tools'", "tool_choice")
        return None, "none"
    if not isinstance(tools, list):
        raise type_error("tools", "an array")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", f"tools[{i}]")
        if not isinstance(fn.get("name"), str) or not fn["name"] or fn["name"] in names:
            raise RequestError(f"tools[{i}].function.name must be a unique non-empty string",
                               f"tools[{i}].function.name")
        if not isinstance(fn.get("parameters", {}), dict):
            raise type_error(f"tools[{i}].function.parameters", "a JSON schema object")
        unknown_keys(t, {"type", "function"}, f"tools[{i}]")
        # strict: a grammar holds the arguments to the schema (under auto too: pipelines/tools.py)
        unknown_keys(fn, {"name", "description", "parameters", "strict"}, f"tools[{i}].function")
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise type_error(f"tools[{i}].function.strict", "a boolean")
        names.add(fn["name"])
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or name not in names:
            raise RequestError(f"'tool_choice' names no function in 'tools': {name!r}" if isinstance(fn, dict)
                               else "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                                    "\"function\": {\"name\": ...}}", "tool_choice")
        unknown_keys(choice, {"type", "function"}, "tool_choice")
        unknown_keys(fn, {"name"}, "tool_choice.function")
    elif choice not in ("none", "auto", "required"):
        raise RequestError("'tool_choice' must be none, auto, required or a named function", "tool_choice")
    return [{"type": "function", "function": t["function"]} for t in tools], choice


def message_text(content: Any, param: str) -> str:
    """A message's text: a string, or an array of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else None
                raise RequestError(f"{param}[{j}]: only text parts are supported, got {kind!r}", f"{param}[{j}]",
                                   "unsupported" if kind else "invalid_type")
            # prompt_cache_breakpoint: the SDK's prompt-cache hint; prefix caching here needs none
            unknown_keys(part, {"type", "text", "prompt_cache_breakpoint"}, f"{param}[{j}]")
        return "".join(p["text"] for p in content)
    raise type_error(param, "a string or an array of text parts")


def read_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise type_error(at, "an object")
        extra = sorted(k for k in set(m) - _MESSAGE_KEYS if not (k in _NULL_MESSAGE_KEYS and m[k] is None))
        if extra:
            code = "unsupported" if extra[0] in _NULL_MESSAGE_KEYS else "unknown_parameter"
            raise RequestError(f"message field '{at}.{extra[0]}' is not supported", f"{at}.{extra[0]}", code)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{at}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{at}.role")
        calls = m.get("tool_calls")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role}  # templates know only system
        if role == "assistant" and calls not in (None, []):
            msg["tool_calls"] = read_tool_calls(calls, f"{at}.tool_calls")
            msg["content"] = None if m.get("content") is None else message_text(m["content"], f"{at}.content")
        else:
            if calls not in (None, []):
                raise RequestError(f"{at}.tool_calls is only for assistant messages", f"{at}.tool_calls")
            msg["content"] = message_text(m.get("content"), f"{at}.content")
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise RequestError(f"{at}.tool_call_id is required for tool messages", f"{at}.tool_call_id",
                                   "invalid_type")
            msg["tool_call_id"] = m["tool_call_id"]
        if m.get("name") is not None:
            if not isinstance(m["name"], str):
                raise type_error(f"{at}.name", "a string")
            msg["name"] = m["name"]  # passed to the chat template, which may use it
        out.append(msg)
    return out


def read_tool_calls(calls: Any, at: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise type_error(at, "an array")
    out = []
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise RequestError(f"{at}[{j}] must have function.name and function.arguments (a JSON string)",
                               f"{at}[{j}]", "invalid_type")
        try:
            json.loads(fn["arguments"])
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
            raise RequestError(f"{at}[{j}].function.arguments is not valid JSON", f"{at}[{j}].function.arguments") \
                from None
        out.append({"id": c.get("id"), "type": "function", "function": {"name": fn["name"],
                                                                         "arguments": fn["arguments"]}})
    return out


def read_prompts(prompt: Any) -> list[str | list[int]]:
    """A completion prompt: a string, an array of strings, token ids, or an array of token-id arrays."""
    def ids(p: Any) -> bool:
        return isinstance(p, list) and bool(p) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)

    if isinstance(prompt, str):
        prompts: list = [prompt]
    elif ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or ids(p) for p in prompt):
        prompts = list(prompt)
    else:
        raise RequestError("'prompt' must be a string, an array of strings, an array of token ids or an array "
                           "of token-id arrays, none empty", "prompt")
    if any(p == "" for p in prompts):
        raise RequestError("'prompt' must not be empty", "prompt")
    if len(prompts) > MAX_PROMPTS:
        raise RequestError(f"'prompt' holds {len(prompts)} prompts; at most {MAX_PROMPTS} per request", "prompt")
    return prompts
