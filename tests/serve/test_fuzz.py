"""A property-based fuzz of request bodies through the OpenAI routes, in-process on the tiny model:
wrong types, extreme numbers, lone surrogates and control characters, nested junk, missing fields,
huge stop lists and content-part arrays. Every answer must be a 2xx or an OpenAI-shaped 4xx, and
afterwards the engine still answers a normal request and holds no KV page.

The examples are derandomized and bounded (EXAMPLES), so CI runs the same few seconds every time.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.engine import EngineConfig, LLMEngine
from serve.app import ServerConfig, create_app

EXAMPLES = 150

ODD_TEXT = ["\ud800", "a\udfffb", "\x00", "\x1b[2J", "\u202e", "\ufeff", "é", "🙂", "<|im_end|>", "</s>", ""]
TEXT = st.one_of(st.text(max_size=12), st.sampled_from(ODD_TEXT),
                 st.text(alphabet=st.sampled_from([c for t in ODD_TEXT for c in t] + ["x", " "]), max_size=8))
NUMBER = st.one_of(st.integers(-3, 3), st.integers(), st.integers(-2**70, 2**70), st.floats(),
                   st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 1e308, -0.0, 0.5, 1024, 1025]))
JUNK = st.recursive(st.none() | st.booleans() | NUMBER | TEXT,
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=8)
FIELDS = ["temperature", "top_p", "top_k", "seed", "max_tokens", "max_completion_tokens", "n", "stop", "stream",
          "stream_options", "logprobs", "top_logprobs", "ignore_eos", "echo", "user", "messages", "prompt", "model",
          "tools", "response_format", "presence_penalty", "logit_bias"]
CONTENT = st.one_of(TEXT, JUNK, st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "text", "audio", ""]), "text": JUNK})), max_size=3))
MESSAGE = st.one_of(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]),
                                           "content": CONTENT}),
                    st.fixed_dictionaries({"role": JUNK, "content": CONTENT}), JUNK)
GOOD_MESSAGE = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "system", "assistant"]),
    "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), min_size=1, max_size=2)})
VALUE = st.one_of(NUMBER, TEXT, JUNK, st.lists(TEXT, max_size=40), st.lists(MESSAGE, max_size=3),
                  st.fixed_dictionaries({"include_usage": JUNK}))


@st.composite
def bodies(draw) -> tuple[str, object]:
    route = draw(st.sampled_from(["chat", "completions"]))
    if draw(st.integers(0, 20)) == 0:
        return route, draw(JUNK)  # not even an object
    body = {"model": MODEL, "max_tokens": draw(st.integers(1, 8))}
    if route == "chat":
        body["messages"] = draw(st.lists(GOOD_MESSAGE, min_size=1, max_size=3))
    else:
        body["prompt"] = draw(TEXT | st.lists(TEXT, min_size=1, max_size=2))
    for _ in range(draw(st.integers(0, 4))):
        field = draw(st.sampled_from(FIELDS) | TEXT)
        if draw(st.integers(0, 4)) == 0:
            body.pop(field, None)
        else:
            body[field] = draw(VALUE)
    return route, body


MODEL = "tiny-fuzz"


@pytest.fixture(scope="module")
def fuzz_client(tiny_model, tiny_tokenizer):
    # A 64-token context bounds every generation the fuzz can ask for.
    engine = LLMEngine(EngineConfig(model=str(tiny_model.source.path), max_batch_size=4, max_seq_len=64),
                       model=tiny_model, tokenizer=tiny_tokenizer)
    app = create_app(ServerConfig(model=str(tiny_model.source.path), served_name=MODEL), load_in_background=False,
                     engine=engine)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, engine


def _check(route: str, body: object, client: TestClient) -> None:
    try:
        data = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        pytest.skip("not serializable")  # pragma: no cover - the strategies only build JSON values
    r = client.post(f"/v1/{'chat/completions' if route == 'chat' else 'completions'}", content=data,
                    headers={"content-type": "application/json"})
    assert r.status_code < 500, (body, r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), r.text
        assert set(err) == {"message", "type", "param", "code"}
    elif r.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and all("error" not in json.loads(e) for e in events[:-1]), r.text[:500]
    else:
        assert r.json()["choices"], r.text[:500]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=bodies())
def test_fuzzed_bodies_get_2xx_or_openai_4xx(case, fuzz_client) -> None:
    client, _ = fuzz_client
    _check(*case, client)


def test_after_the_fuzz_the_engine_serves_and_holds_no_pages(fuzz_client) -> None:
    client, engine = fuzz_client
    r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert client.get("/health").json()["engine"]["alive"] is True
    assert engine.kv_pages_in_use() == 0 and engine.scheduler.reserved_pages == 0 and not engine.has_work
