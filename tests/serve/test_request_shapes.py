"""Request shapes clients send: text content parts in every role, tool turns, completion prompts as
lists and token ids, n, echo; parsed alone, then through the server with the openai SDK (streaming
included)."""

from __future__ import annotations

import openai
import pytest

from serve.protocol import APIError, parse_request

CTX = 1024
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant", "tool"])
def test_text_parts_are_taken_in_every_role(role: str) -> None:
    msg = {"role": role, "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    if role == "tool":
        msg["tool_call_id"] = "call_1"
    req = parse_request({**CHAT, "messages": [msg, {"role": "user", "content": "hi"}]}, "chat", CTX)
    assert req.messages[0]["content"] == "ab"


def test_an_agent_loop_second_turn_is_taken() -> None:
    turns = [{"role": "user", "content": "2+3?"},
             {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                 {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2}"}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    req = parse_request({**CHAT, "messages": turns}, "chat", CTX)
    assert req.messages[1]["content"] is None and req.messages[1]["tool_calls"][0]["function"]["name"] == "add"
    assert req.messages[2] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}


@pytest.mark.parametrize("turn,param", [
    ({"role": "tool", "content": "5"}, "messages[0].tool_call_id"),
    ({"role": "user", "content": None}, "messages[0].content"),
    ({"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                            "function": {"name": "f", "arguments": "{x"}}]},
     "messages[0].tool_calls[0].function.arguments"),
    ({"role": "user", "content": "x", "refusal": "no"}, "messages[0].refusal"),
    ({"role": "user", "content": "x", "weight": 1}, "messages[0].weight"),
])
def test_malformed_turns_are_named(turn: dict, param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_request({**CHAT, "messages": [turn]}, "chat", CTX)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("prompt,count", [("a", 1), (["a", "b"], 2), ([1, 2, 3], 1), ([[1, 2], [3]], 2),
                                          (["a", [5, 6]], 2)])
def test_completion_prompts_take_every_openai_form(prompt, count: int) -> None:
    assert len(parse_request({"model": "m", "prompt": prompt}, "completion", CTX).prompts) == count


@pytest.mark.parametrize("prompt", ["", [], [[]], [1.5], [True], {"a": 1}, [""]])
def test_malformed_prompts_are_a_400(prompt) -> None:
    with pytest.raises(APIError) as err:
        parse_request({"model": "m", "prompt": prompt}, "completion", CTX)
    assert err.value.param == "prompt"


def test_max_tokens_zero_needs_echo() -> None:
    req = parse_request({"model": "m", "prompt": "a", "echo": True, "logprobs": 1, "max_tokens": 0}, "completion", CTX)
    assert req.params.max_tokens == 0 and req.params.prompt_logprobs == 1
    req = parse_request({"model": "m", "prompt": "a", "echo": True, "max_tokens": 0}, "completion", CTX)
    assert req.params.max_tokens == 0 and req.params.logprobs is None  # the prompt back, nothing generated
    for body in ({"logprobs": 1}, {}):
        with pytest.raises(APIError) as err:
            parse_request({"model": "m", "prompt": "a", "max_tokens": 0, **body}, "completion", CTX)
        assert err.value.param == "max_tokens"


def test_forced_tool_choice_and_response_format_conflict() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    with pytest.raises(APIError) as err:
        parse_request({**CHAT, "tools": tools, "tool_choice": "required", "response_format": {"type": "json_object"}},
                      "chat", CTX)
    assert err.value.param == "response_format"
    with pytest.raises(APIError) as err:
        parse_request({**CHAT, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}},
                      "chat", CTX)
    assert err.value.param == "tool_choice"


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def test_n_choices_streamed_equal_the_plain_ones(server) -> None:
    client = _client(server)
    model = client.models.list().data[0].id
    kwargs = dict(model=model, messages=[{"role": "user", "content": "hi"}], n=3, temperature=0.9, seed=7,
                  max_tokens=8)
    plain = client.chat.completions.create(**kwargs)
    assert sorted(c.index for c in plain.choices) == [0, 1, 2]
    texts = {i: "" for i in range(3)}
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == {c.index: c.message.content for c in plain.choices}
    one = client.chat.completions.create(**{**kwargs, "n": 1})
    assert plain.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt counts once, not n times
    assert 3 <= plain.usage.completion_tokens <= 3 * 8


def test_echo_streams_the_prompt_first(server) -> None:
    client = _client(server)
    model = client.models.list().data[0].id
    plain = client.completions.create(model=model, prompt="The sky is", max_tokens=4, temperature=0, echo=True,
                                      logprobs=1)
    assert plain.choices[0].text.startswith("The sky is")
    assert plain.choices[0].logprobs.token_logprobs[0] is None
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="The sky is", max_tokens=4, temperature=0, echo=True, stream=True) if c.choices)
    assert streamed == plain.choices[0].text


@pytest.mark.parametrize("where,param", [("response_format", "response_format"), ("required", "tools"),
                                         ("strict_auto", "tools")])
def test_an_unsupported_schema_is_a_400_naming_its_field(server, where: str, param: str) -> None:
    bad = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    ok = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fn = {"name": "f", "parameters": {"type": "object", "properties": {"xs": bad}}}
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": bad}}}
    if where == "required":
        body = {"tools": [{"type": "function", "function": fn}], "tool_choice": "required"}
    elif where == "strict_auto":  # a valid response_format beside it: the tools' schema is the bad one
        body = {"tools": [{"type": "function", "function": {**fn, "strict": True}}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": ok}}}
    with pytest.raises(openai.BadRequestError) as err:
        client = _client(server)
        client.chat.completions.create(model=client.models.list().data[0].id, messages=CHAT["messages"],
                                       max_tokens=4, **body)
    assert err.value.body["param"] == param and err.value.body["code"] == "unsupported_schema"
    assert "uniqueItems" in err.value.body["message"]
