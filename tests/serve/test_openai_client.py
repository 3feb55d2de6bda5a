"""The server through the official openai client: chat, streaming, completions, models, every error.

Every test runs twice: on `crucible serve` (one uvicorn process) and on `crucible serve --ray --replicas 2`
(two replicas behind Ray Serve's proxy, with the guarded settings and API key).
"""

from __future__ import annotations

import httpx
import openai
import pytest

from serve.launch import Server

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(params=["uvicorn", "ray-serve"])
def served(request: pytest.FixtureRequest) -> Server:
    return request.getfixturevalue("server" if request.param == "uvicorn" else "ray_server")


@pytest.fixture(params=["uvicorn", "ray-serve"])
def guarded(request: pytest.FixtureRequest) -> Server:
    """API key "sesame", 4 sequences admitted per process (or per replica), 16 KB bodies."""
    return request.getfixturevalue("guarded_server" if request.param == "uvicorn" else "ray_server")


def _client(server: Server, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=key or server.api_key or "unused", max_retries=0, timeout=120)


def _auth(server: Server) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}


def _model(server: Server) -> str:
    return _client(server).models.list().data[0].id


def test_models_lists_the_served_model(served) -> None:
    models = _client(served).models.list().data
    assert [m.id for m in models] == ["tiny-llama-Q4_0.gguf"]


def test_chat_plain_reports_usage_and_kernels(served) -> None:
    client = _client(served)
    raw = client.chat.completions.with_raw_response.create(model=_model(served), messages=PROMPT, temperature=0,
                                                           max_tokens=8)
    resp = raw.parse()
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].message.content
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 8 and resp.usage.prompt_tokens > 5
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.system_fingerprint.startswith("crucible-")
    assert "fallbacks=none" in raw.headers["x-crucible-kernels"]
    assert "activations=f32" in raw.headers["x-crucible-kernels"]


def test_chat_streaming_equals_plain(served) -> None:
    client = _client(served)
    plain = client.chat.completions.create(model=_model(served), messages=PROMPT, temperature=0, max_tokens=12)
    chunks = list(client.chat.completions.create(model=_model(served), messages=PROMPT, temperature=0, max_tokens=12,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_completions_plain_and_streaming(served) -> None:
    client = _client(served)
    plain = client.completions.create(model=_model(served), prompt="The capital of France", temperature=0, max_tokens=6)
    assert plain.object == "text_completion" and plain.usage.completion_tokens >= 1
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=_model(served), prompt="The capital of France", temperature=0, max_tokens=6, stream=True) if c.choices)
    assert streamed == plain.choices[0].text


def test_logprobs_plain_and_streaming(served) -> None:
    client = _client(served)
    kw = dict(model=_model(served), messages=PROMPT, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3)
    plain = client.chat.completions.create(**kw)
    content = plain.choices[0].logprobs.content
    assert len(content) == plain.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        tops = [a.logprob for a in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # Greedy: the chosen token is the most likely one (ties aside).
        assert t.logprob == pytest.approx(tops[0], abs=1e-9)
        if "\ufffd" not in t.token:  # a token holding part of a character reports its own bytes
            assert bytes(t.bytes) == t.token.encode()
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    comp = client.completions.create(model=_model(served), prompt="The capital of France", temperature=0,
                                     max_tokens=4, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == comp.usage.completion_tokens
    assert lp.text_offset[0] == 0 and all(len(t) <= 2 for t in lp.top_logprobs)
    assert client.chat.completions.create(model=_model(served), messages=PROMPT, max_tokens=2,
                                          temperature=0).choices[0].logprobs is None


def test_stop_seed_and_temperature(served) -> None:
    client = _client(served)
    kw = dict(model=_model(served), messages=PROMPT, max_tokens=10)
    a = client.chat.completions.create(temperature=0.9, seed=5, **kw).choices[0].message.content
    b = client.chat.completions.create(temperature=0.9, seed=5, **kw).choices[0].message.content
    assert a == b
    full = client.chat.completions.create(temperature=0, **kw).choices[0].message.content
    if len(full) > 4:
        stop = full[2:4]
        cut = client.chat.completions.create(temperature=0, stop=[stop], **kw)
        assert cut.choices[0].message.content == full[: full.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kwargs,status,param", [
    (dict(model="no-such-model", messages=PROMPT), 404, "model"),
    (dict(messages=[]), 400, "messages"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0].role"),
    (dict(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content"),
    (dict(messages=PROMPT, temperature="hot"), 400, "temperature"),
    (dict(messages=PROMPT, max_tokens=-5), 400, "max_tokens"),
    (dict(messages=PROMPT, max_tokens=10**9), 400, "max_tokens"),
    (dict(messages=PROMPT, top_p=1.5), 400, "top_p"),
    (dict(messages=PROMPT, top_logprobs=3), 400, "top_logprobs"),
    (dict(messages=PROMPT, logprobs=True, top_logprobs=50), 400, "top_logprobs"),
    (dict(messages=[{"role": "user", "content": "word " * 3000}]), 400, "messages"),
])
def test_bad_requests_get_openai_errors(served, kwargs, status: int, param: str) -> None:
    kwargs = {"model": _model(served), **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        _client(served).chat.completions.create(**kwargs)
    assert err.value.status_code == status
    body = err.value.body
    assert body["param"] == param and body["message"] and body["type"]


def test_malformed_json_and_missing_fields(served) -> None:
    r = httpx.post(served.v1 + "/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json", **_auth(served)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(served.v1 + "/chat/completions", json={"messages": PROMPT}, headers=_auth(served))
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    r = httpx.post(served.v1 + "/completions", json={"model": "tiny-llama-Q4_0.gguf"}, headers=_auth(served))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_auth_on(guarded) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        _client(guarded, key="wrong").models.list()
    assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
    assert httpx.get(guarded.v1 + "/models").status_code == 401
    assert httpx.get(guarded.base_url + "/health").status_code == 200  # health stays open
    ok = _client(guarded, key="sesame").chat.completions.create(
        model="tiny-llama-Q4_0.gguf", messages=PROMPT, temperature=0, max_tokens=3)
    assert ok.choices[0].message.content is not None


def test_body_limit_and_backpressure(guarded) -> None:
    headers = {"Authorization": "Bearer sesame"}
    big = {"model": "tiny-llama-Q4_0.gguf", "messages": [{"role": "user", "content": "x" * 40000}]}
    r = httpx.post(guarded.v1 + "/chat/completions", json=big, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    import concurrent.futures as cf

    def one(_):
        return httpx.post(guarded.v1 + "/chat/completions", headers=headers, timeout=300, json={
            "model": "tiny-llama-Q4_0.gguf", "messages": PROMPT, "max_tokens": 300, "ignore_eos": True,
            "temperature": 0})

    with cf.ThreadPoolExecutor(12) as pool:
        responses = list(pool.map(one, range(12)))
    codes = sorted(r.status_code for r in responses)
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
    limited = next(r for r in responses if r.status_code == 429)
    assert limited.headers["retry-after"] == "1" and limited.json()["error"]["type"] == "rate_limit_error"
