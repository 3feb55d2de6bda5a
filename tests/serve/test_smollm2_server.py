"""The README's server: the embedded SmolLM2 answers the capital question with Paris, fills a pydantic
model and calls a tool with the right argument, and reuses a long system prompt's pages."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from pydantic import BaseModel

from serve.launch import Server, start_server, stop_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2_server() -> Iterator[Server]:
    s = start_server("smollm2-135m")
    yield s
    stop_server(s)


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=300)


@pytest.mark.slow
def test_smollm2_server_answers_paris(smollm2_server: Server) -> None:
    client = _client(smollm2_server)
    resp = client.chat.completions.create(model="smollm2-135m", messages=QUESTION, temperature=0, max_tokens=32)
    assert "Paris" in resp.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smollm2-135m", messages=QUESTION, temperature=0, max_tokens=32, stream=True) if c.choices)
    assert streamed == resp.choices[0].message.content


class Capital(BaseModel):
    country: str
    capital: str


@pytest.mark.slow
def test_smollm2_structured_output_and_tool_calls(smollm2_server: Server) -> None:
    client = _client(smollm2_server)
    parsed = client.chat.completions.parse(model="smollm2-135m", messages=QUESTION, response_format=Capital,
                                           temperature=0, max_tokens=64).choices[0].message.parsed
    assert isinstance(parsed, Capital) and parsed.capital == "Paris"
    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                               "parameters": city}}]
    choice = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=tools,
        tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64).choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == '{"city": "Paris"}'


@pytest.mark.slow
def test_smollm2_reuses_a_long_system_prompt(smollm2_server: Server) -> None:
    client = _client(smollm2_server)
    system = {"role": "system", "content": "You are a careful librarian. " * 150}
    first, second = (client.chat.completions.create(model="smollm2-135m", messages=[system, {"role": "user",
                                                                                           "content": q}],
                                                    temperature=0, max_tokens=1) for q in ("Hi", "Hello"))
    assert first.usage.prompt_tokens > 700 and first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 640  # whole 128-token pages of the system prompt
