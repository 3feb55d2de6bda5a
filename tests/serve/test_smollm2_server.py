"""The README's server: the embedded SmolLM2 answers the capital question with Paris."""

from __future__ import annotations

import openai
import pytest

from serve.launch import start_server, stop_server


@pytest.mark.slow
def test_smollm2_server_answers_paris() -> None:
    s = start_server("smollm2-135m")
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="none", max_retries=0, timeout=300)
        resp = client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0, max_tokens=32)
        assert "Paris" in resp.choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="smollm2-135m", messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0, max_tokens=32, stream=True) if c.choices)
        assert streamed == resp.choices[0].message.content
    finally:
        stop_server(s)
