"""Real clients against a real server process (the tiny random-weight model): the openai SDK's tool
round trip, streamed tool calls and `parse` with a pydantic model; LangChain's with_structured_output
both ways; and the request shapes lm-eval-harness's local-completions model sends (loglikelihood and
generate_until), checked against the model's own logits."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import numpy as np
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.openai_fixtures import TOOLS, reference_logprobs

ASK = [{"role": "user", "content": "What is 2 + 3? Use the tool."}]


class Town(BaseModel):
    """Bounded fields: a random model completes them well within max_tokens."""

    kind: Literal["town", "city"]
    population: int = Field(ge=0, le=999)
    capital: bool


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def _model(server) -> str:
    return _client(server).models.list().data[0].id


def test_openai_sdk_tool_round_trip(server) -> None:
    client, model = _client(server), _model(server)
    first = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required",
                                           max_tokens=160, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice.message.content
    call = choice.message.tool_calls[0]
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema)
    # The agent loop's second turn: the SDK's own message object back, then the tool's result.
    messages = ASK + [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=16,
                                            temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_openai_sdk_assembles_streamed_tool_calls(server) -> None:
    client, model = _client(server), _model(server)
    kwargs = dict(model=model, messages=ASK, tools=TOOLS, max_tokens=200, temperature=0,
                  tool_choice={"type": "function", "function": {"name": "add"}})
    plain = client.chat.completions.create(**kwargs)
    with client.chat.completions.stream(**kwargs) as stream:
        final = stream.get_final_completion()
    got, want = final.choices[0].message.tool_calls, plain.choices[0].message.tool_calls
    assert [c.function.name for c in got] == [c.function.name for c in want]
    assert [json.loads(c.function.arguments) for c in got] == [json.loads(c.function.arguments) for c in want]
    assert final.choices[0].finish_reason == "tool_calls"


def test_openai_sdk_parse_with_a_pydantic_model(server) -> None:
    client = _client(server)
    done = client.chat.completions.parse(model=_model(server), messages=[{"role": "user", "content": "Describe Oslo."}],
                                         response_format=Town, max_tokens=120, temperature=0.7, seed=2, n=3)
    for choice in done.choices:
        assert isinstance(choice.message.parsed, Town), choice.message.content


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(server, method: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.v1, api_key="unused", model=_model(server), temperature=0, max_tokens=160,
                     max_retries=0, timeout=120)
    answer = llm.with_structured_output(Town, method=method).invoke("Describe Oslo.")
    assert isinstance(answer, Town)


def test_lm_eval_loglikelihood_requests(server, tiny_model) -> None:
    """lm-eval's local-completions loglikelihood: token-id prompts, echo, logprobs=1, max_tokens=1; it
    reads token_logprobs[ctxlen:-1] and compares each with its top_logprobs for is_greedy."""
    contexts, continuation = [[5, 6, 7, 8, 9], [20, 30, 40]], [11, 12, 13]
    body = {"model": _model(server), "prompt": [c + continuation for c in contexts], "temperature": 0,
            "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    r = httpx.post(f"{server.v1}/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    for ctx, choice in zip(contexts, choices):
        tokens = ctx + continuation
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(tokens) + 1 and lp["token_logprobs"][0] is None
        logp = reference_logprobs(tiny_model, tokens)
        want = [logp[i - 1, tokens[i]] for i in range(len(ctx), len(tokens))]
        got = lp["token_logprobs"][len(ctx):-1]
        np.testing.assert_allclose(got, want, atol=1e-4)  # same file, same kernels, another process
        for value, top in zip(got, lp["top_logprobs"][len(ctx):-1]):
            assert len(top) == 1 and max(top.values()) >= value - 1e-9
    zero = httpx.post(f"{server.v1}/completions", json={**body, "max_tokens": 0}, timeout=120).json()
    for a, b in zip(sorted(zero["choices"], key=lambda c: c["index"]), choices):
        assert a["logprobs"]["token_logprobs"] == b["logprobs"]["token_logprobs"][:-1]


def test_lm_eval_generate_until_requests(server) -> None:
    body = {"model": _model(server), "prompt": ["Question: 2 + 2 =", "Question: 3 + 3 ="], "max_tokens": 16,
            "temperature": 0, "stop": ["\n\n", "Question:"], "seed": 1234}
    r = httpx.post(f"{server.v1}/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert sorted(c["index"] for c in choices) == [0, 1]
    single = httpx.post(f"{server.v1}/completions", json={**body, "prompt": body["prompt"][1]}, timeout=120).json()
    assert next(c for c in choices if c["index"] == 1)["text"] == single["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
def test_structured_output_in_completions_streamed_or_not(server, stream: bool) -> None:
    """response_format on /v1/completions too; streamed chunks join into the same valid document."""
    schema = {**Town.model_json_schema(), "additionalProperties": False}  # else free extra keys may run long
    body = dict(model=_model(server), prompt="Oslo:", max_tokens=120, temperature=0,
                extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "town",
                                                                                      "schema": schema}}})
    client = _client(server)
    if stream:
        text = "".join(c.choices[0].text for c in client.completions.create(**body, stream=True) if c.choices)
    else:
        text = client.completions.create(**body).choices[0].text
    Town.model_validate_json(text)
    assert text == client.completions.create(**body).choices[0].text
