"""The choices of one response: each sequence's outputs gathered, then rendered as OpenAI choices.

A request has len(prompts) x n sequences; choice `index` = prompt * n + sequence, as OpenAI numbers
them. A chat choice whose request has tools is read for tool calls (pipelines/tools.py): while
streaming, text that may be the start of a <tool_call> block is held back, and the calls are sent as
`tool_calls` deltas when the sequence ends, which is how the OpenAI SDK assembles them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines.logprobs import TokenLogprob
from pipelines.openai_request import GenerationRequest, final_output
from pipelines.request import RequestOutput
from pipelines.tools import ToolCall, content_before_call
from serve.protocol import TextOffsets, logprobs_object


@dataclass
class Choice:
    """One sequence's output so far.

    Attributes:
        index: The choice's index in the response.
        prompt_ids: Its prompt (echo writes it back).
        parts: Text released so far, in order.
        entries: Logprobs of the generated tokens (when asked).
        prompt_entries: Logprobs of the prompt tokens (echo with logprobs), None for the first.
        sent_text: Content already streamed (chat).
        offsets: Text offsets of the tokens whose logprobs went out (completions' text_offset).
        echoed: The prompt was streamed (echo).
        last: The sequence's last output (its finish reason and counts), once it has one.
    """

    index: int
    prompt_ids: list[int]
    parts: list[str] = field(default_factory=list)
    entries: list[TokenLogprob] = field(default_factory=list)
    prompt_entries: tuple[TokenLogprob | None, ...] = ()
    sent_text: str = ""
    offsets: TextOffsets = field(default_factory=TextOffsets)
    echoed: bool = False
    last: RequestOutput | None = None

    def add(self, out: RequestOutput) -> None:
        self.parts.append(out.text_delta)
        self.entries.extend(out.logprobs)
        if out.prompt_logprobs:
            self.prompt_entries = out.prompt_logprobs
        self.last = out

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def finished(self) -> bool:
        return self.last is not None and self.last.finished

    def final(self, req: GenerationRequest) -> tuple[str, list[ToolCall], str]:
        """(content, tool calls, finish reason) of the finished text."""
        return final_output(req, self.text, self.last.finish_reason if self.last is not None else None)

    def logprob_entries(self, req: GenerationRequest) -> list[TokenLogprob | int]:
        """Echo: the prompt tokens (the first as a bare id, it has no logprob) then the generated ones."""
        if not (req.echo and self.prompt_entries):
            return list(self.entries)
        head: list[TokenLogprob | int] = [e if e is not None else self.prompt_ids[0] for e in self.prompt_entries]
        return head + list(self.entries)


def choice_object(req: GenerationRequest, choice: Choice, token_text: Callable[[int], str],
                  decode: Callable[[list[int]], str], raw: Callable[[int], bytes] | None = None) -> dict[str, Any]:
    """A finished choice of a chat.completion or text_completion (raw: a token's bytes, for logprobs)."""
    content, calls, reason = choice.final(req)
    logprobs = None
    if req.params.logprobs is not None:
        logprobs = logprobs_object(req.kind, choice.logprob_entries(req), token_text,
                                   shown=lambda i: decode([i]), raw=raw, offsets=TextOffsets())
    if req.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
        if calls:
            message["tool_calls"] = [c.openai() for c in calls]
        return {"index": choice.index, "message": message, "finish_reason": reason, "logprobs": logprobs}
    text = (decode(choice.prompt_ids) + content) if req.echo else content
    return {"index": choice.index, "text": text, "finish_reason": reason, "logprobs": logprobs}


def stream_delta(req: GenerationRequest, choice: Choice, out: RequestOutput, token_text: Callable[[int], str],
                 decode: Callable[[list[int]], str], raw: Callable[[int], bytes] | None = None) -> list[dict[str, Any]]:
    """The streamed choice entries (without the envelope) that one output produces, in order."""
    logprobs = None
    if req.params.logprobs is not None and (out.logprobs or (req.echo and out.prompt_logprobs)):
        entries: list[TokenLogprob | int] = list(out.logprobs)
        if req.echo and out.prompt_logprobs:
            entries = [e if e is not None else choice.prompt_ids[0] for e in out.prompt_logprobs] + entries
        logprobs = logprobs_object(req.kind, entries, token_text, shown=lambda i: decode([i]), raw=raw,
                                   offsets=choice.offsets)
    if req.kind == "completion":
        text = out.text_delta
        if req.echo and not choice.echoed:  # the first output of the sequence carries the prompt
            text = decode(choice.prompt_ids) + text
            choice.echoed = True
        items = [{"index": choice.index, "text": text, "finish_reason": None, "logprobs": logprobs}] \
            if text or logprobs else []
        if out.finished:
            items.append({"index": choice.index, "text": "", "finish_reason": choice.final(req)[2],
                          "logprobs": None})
        return items
    items = []
    full = choice.text
    if out.finished:
        content, calls, reason = choice.final(req)
        # Send what the final content adds to what went out (text after call blocks included).
        sent = choice.sent_text if content.startswith(choice.sent_text) else choice.sent_text.strip()
        new = content[len(sent):] if content.startswith(sent) else ""
    else:
        calls, reason = [], None
        ready = full
        if req.parses_tool_calls:  # hold back a call that is being written: a block or a bare JSON object
            ready = "" if full.lstrip().startswith("{") else content_before_call(full)
        new = ready[len(choice.sent_text):]
    if new or logprobs:
        items.append({"index": choice.index, "delta": {"content": new} if new else {}, "finish_reason": None,
                      "logprobs": logprobs})
        choice.sent_text += new
    if calls:
        items.append({"index": choice.index, "delta": {"tool_calls": [c.openai(i) for i, c in enumerate(calls)]},
                      "finish_reason": None, "logprobs": None})
    if out.finished:
        items.append({"index": choice.index, "delta": {}, "finish_reason": reason, "logprobs": None})
    return items
