"""Tool calling: tools into the prompt, tool_choice into a grammar, the output back into tool calls.

Tool calls are written in the Hermes format that Qwen2.5/3, Hermes and SmolLM3 are trained on:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

- Prompt. When the model's chat template takes `tools` (its source mentions them), the tools, the
  assistant's earlier `tool_calls` and the `tool` results go through the template. Otherwise
  (SmolLM2, Llama 2) the generic prompt below is prepended to the system message, earlier calls are
  written as <tool_call> blocks and results as <tool_response> blocks in a user turn.
- tool_choice "none": no tools in the prompt, free text. "auto": free text, and any <tool_call>
  blocks in it become tool calls. "required" or a named function: the output is constrained by a Lark
  grammar to <tool_call> blocks whose JSON follows the functions' parameter schemas (one block, or
  several with parallel_tool_calls).
- "auto" with a `strict` tool: the text stays free, but from each <tool_call> on, the grammar holds
  the block: a known name, and arguments that follow the schema (any JSON object for a tool without
  strict). This is llguidance's lazy-lexeme pattern for tool calls (docs/syntax.md, "Tool calling").
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from pipelines.grammar import JSON_OPTIONS, Grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
TOOL_TAGS = (OPEN, CLOSE)
GENERIC_PROMPT = (
    "You may call one or more functions to help with the user's request. The functions are described "
    "in JSON below:\n<tools>\n{tools}\n</tools>\nTo call a function, answer with one block per call, "
    "each holding a JSON object with the function's name and arguments:\n"
    "<tool_call>\n{{\"name\": <function-name>, \"arguments\": <arguments-json-object>}}\n</tool_call>")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made.

    Attributes:
        id: "call_..." (unique).
        name: The function.
        arguments: Its arguments as JSON text (OpenAI's `function.arguments`).
    """

    id: str
    name: str
    arguments: str

    def openai(self, index: int | None = None) -> dict[str, Any]:
        """The OpenAI `tool_calls` entry (with `index` for a streaming delta)."""
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the model's chat template renders a `tools` list itself."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(template, str) and "tools" in template


def special_tag_ids(tokenizer: Any) -> dict[str, int]:
    """The tool-call tags that this tokenizer makes special tokens (Hermes-style), by tag: a grammar
    must name those as tokens, since no text spells a special token."""
    listed = set(getattr(tokenizer, "all_special_ids", ()))
    # Special tokens are added tokens: no need to build the whole vocabulary (150k entries) per request.
    return {t.content: i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()
            if t.content in TOOL_TAGS and (t.special or i in listed)}


def tools_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool,
                  answer: Grammar | None = None, special: dict[str, int] | None = None) -> Grammar | None:
    """The grammar that tool_choice (with response_format's, under auto) asks for.

    Args:
        tools: Validated OpenAI tool definitions ({"type": "function", "function": {...}}).
        choice: "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.
        parallel: Allow several calls.
        answer: response_format's grammar (json_object or json_schema), taken under "auto" only.
        special: special_tag_ids of the tokenizer: those tags are written as their tokens.

    Returns:
        None for "none", and for "auto" with neither a strict tool nor an answer format. "required" or
        named: nothing but <tool_call> blocks. "auto" with an answer format: tool calls or that answer.
        "auto" with a strict tool: free text in which each <tool_call> block is held to the schemas.
    """
    functions = [t["function"] for t in tools]
    if choice == "none" or (choice == "auto" and answer is None and not any(f.get("strict") for f in functions)):
        return None
    if isinstance(choice, dict):
        functions = [f for f in functions if f["name"] == choice["function"]["name"]]
    body = f"body: %json {json.dumps(_calls_schema(functions, every=choice != 'auto'))}"
    special = special or {}
    open_, close = (f"<[{special[t]}]>" if t in special else _lark(t) for t in (OPEN, CLOSE))
    call = f"{open_} \"\\n\" body \"\\n\" {close}"
    calls = f"calls: call (\"\\n\" call)*" if parallel else "calls: call"
    if choice != "auto":
        return Grammar("lark", "\n".join(["start: calls", f"call: {call}", calls, body]))
    if answer is not None:
        schema = {"type": "object"} if answer.kind == "json_object" else json.loads(answer.text)
        return Grammar("lark", "\n".join(["start: calls | answer", f"call: {call}", calls, body,
                                          f"answer: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}"]))
    # Free text with calls in it: call_head is lazy, so it ends at the first <tool_call> (llguidance's
    # pattern for tool calls, docs/syntax.md); the TEXT after the last call cannot open another. A
    # special-token tag needs no lazy head: no text matches a special token, so TEXT ends before it.
    lazy = [] if OPEN in special else [f"call_head[lazy]: ANY {_lark(OPEN)}", "ANY: /(.|\\n)*/"]
    return Grammar("lark", "\n".join([
        f"start: text_call{'*' if parallel else '?'} TEXT",
        f"text_call: {'TEXT ' + open_ if OPEN in special else 'call_head'} \"\\n\" body \"\\n\" {close}",
        *lazy, f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{_regex(OPEN)}(.|\\n)*/", body]))


def _calls_schema(functions: list[dict[str, Any]], every: bool) -> dict[str, Any]:
    """The JSON of one call: a known name and its arguments, held to the parameters' schema when
    `every` (required or named) or when the tool is strict, else any JSON object."""
    def arguments(f: dict[str, Any]) -> dict[str, Any]:
        if every or f.get("strict"):
            return f.get("parameters") or {"type": "object", "properties": {}}
        return {"type": "object"}

    return {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": arguments(f)},
                       "required": ["name", "arguments"], "additionalProperties": False} for f in functions],
            "x-guidance": JSON_OPTIONS}


def _lark(text: str) -> str:
    return json.dumps(text)


def _regex(text: str) -> str:
    return re.escape(text)  # Python's escapes are a subset Rust's regex reads the same (not "\\<")


def tools_messages(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) \
        -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages (and the `tools` argument) for the chat template, tool turns included.

    Returns:
        (messages, tools to pass to apply_chat_template or None).
    """
    native = template_takes_tools(tokenizer)
    out = []
    for m in messages:
        calls = m.get("tool_calls") or []
        if native:
            if calls:  # templates expect arguments as a mapping
                m = {**m, "content": m.get("content") or "", "tool_calls": [
                    {"type": "function", "function": {"name": c["function"]["name"],
                                                      "arguments": _loads(c["function"]["arguments"])}}
                    for c in calls]}
            out.append(m)
        elif calls:
            blocks = "\n".join(f"{OPEN}\n" + json.dumps({"name": c["function"]["name"],
                                                          "arguments": _loads(c["function"]["arguments"])})
                               + f"\n{CLOSE}" for c in calls)
            out.append({"role": "assistant", "content": ((m.get("content") or "") + "\n" + blocks).strip()})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    if not tools or native:
        return out, (tools or None)
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    prompt = GENERIC_PROMPT.format(tools=listing)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out, None


def parse_tool_calls(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    """Splits generated text into its content and the tool calls it makes.

    Each <tool_call> opening is followed by one JSON object (read with raw_decode, so a closing tag cut
    off by max_tokens still yields the complete call before it). A block whose JSON does not parse, or
    names no known function, stays in the content: the client sees what the model wrote rather than a
    call that cannot run.

    Returns:
        (content without the call blocks, the calls in order).
    """
    calls, kept, pos = [], [], 0
    decoder = json.JSONDecoder()
    while (at := text.find(OPEN, pos)) >= 0:
        body = at + len(OPEN)
        body += len(text[body:]) - len(text[body:].lstrip())
        try:
            obj, end = decoder.raw_decode(text, body)
        except ValueError:
            obj, end = None, body
        call = _call(obj, names)
        if call is None:
            kept.append(text[pos:body])
            pos = body
            continue
        kept.append(text[pos:at])
        calls.append(call)
        rest = text[end:]
        pos = end + (len(rest) - len(rest.lstrip()))
        if text.startswith(CLOSE, pos) or CLOSE.startswith(text[pos:]):  # a cut-off tag is still the tag
            pos = min(len(text), pos + len(CLOSE))
    if not calls:  # some templates (Llama 3.1) call with a bare JSON object
        try:
            call = _call(json.loads(text.strip()), names)
        except ValueError:
            call = None
        return ("", [call]) if call is not None else (text, [])
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


def _call(obj: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"],
                    args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def _loads(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def content_before_call(text: str) -> str:
    """The part of streamed text that can be sent as content now: everything before a <tool_call>
    block, less a tail that could still grow into one."""
    at = text.find(OPEN)
    if at >= 0:
        return text[:at]
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-k:]):
            return text[:-k]
    return text
