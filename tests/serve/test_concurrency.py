"""32 simultaneous streams without cross-talk, and client disconnects that free their KV pages."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai


def _metric(server, name: str) -> float:
    text = httpx.get(server.base_url + "/metrics").text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def _wait_idle(server, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _metric(server, "crucible_running_requests") == 0 and _metric(server, "crucible_kv_cache_pages_used") == 0:
            return
        time.sleep(0.2)
    raise AssertionError("requests still running or KV pages still held")


def test_32_concurrent_streams_equal_each_alone(server) -> None:
    model = "tiny-llama-Q4_0.gguf"
    prompts = [f"Request {i}: tell me about the number {i * 7}." for i in range(32)]
    client = openai.AsyncOpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=600)

    async def stream(prompt: str) -> str:
        out = []
        async for chunk in await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=16,
                stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                out.append(chunk.choices[0].delta.content)
        return "".join(out)

    async def main():
        return await asyncio.gather(*(stream(p) for p in prompts))

    together = asyncio.run(main())
    sync = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=600)
    for prompt, text in zip(prompts, together):
        alone = sync.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                             temperature=0, max_tokens=16).choices[0].message.content
        assert text == alone
    _wait_idle(server)


def test_disconnect_mid_stream_cancels_and_frees_pages(server) -> None:
    body = {"model": "tiny-llama-Q4_0.gguf", "messages": [{"role": "user", "content": "Go on forever."}],
            "max_tokens": 900, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", server.v1 + "/chat/completions", json=body) as r:
            seen = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen >= 4:
                    break
    assert seen >= 4
    _wait_idle(server)
    assert _metric(server, "crucible_requests_in_flight") == 0
