"""Every numeric field of a request is checked at the edge, at both ends of its range, and text that
is not valid Unicode is a 400 that names where it is (parse_request alone, no server)."""

from __future__ import annotations

import pytest

from serve.protocol import APIError, parse_request

CTX = 1024
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}

# field -> (lowest accepted, highest accepted, just below, just above); None: no such bound.
BOUNDS = {
    "temperature": (0, 2, -1e-9, 2 + 1e-9),
    "top_p": (1e-9, 1, 0, 1 + 1e-9),
    "top_k": (-1, 1_000_000, -2, 1_000_001),  # -1: vLLM's "off"
    "seed": (-(2**63), 2**63 - 1, -(2**63) - 1, 2**63),
    "max_tokens": (1, CTX, 0, CTX + 1),
    "max_completion_tokens": (1, CTX, 0, CTX + 1),
    "n": (1, 8, 0, 9),
    "presence_penalty": (-2, 2, -2 - 1e-9, 2 + 1e-9),
    "frequency_penalty": (-2, 2, -2 - 1e-9, 2 + 1e-9),
    "min_p": (0, 1, -1e-9, 1 + 1e-9),
    "repetition_penalty": (1e-9, 100, 0, 100 + 1e-9),
}


@pytest.mark.parametrize("kind,body", [("chat", CHAT), ("completion", COMPLETION)])
@pytest.mark.parametrize("field", sorted(BOUNDS))
def test_numeric_fields_at_both_ends(kind: str, body: dict, field: str) -> None:
    lo, hi, below, above = BOUNDS[field]
    for ok in (lo, hi):
        parse_request({**body, field: ok}, kind, CTX)
    for bad in (below, above, float("nan"), float("inf"), True, "1"):
        with pytest.raises(APIError) as err:
            parse_request({**body, field: bad}, kind, CTX)
        assert err.value.status == 400 and err.value.param == field, (field, bad)


def test_logprob_counts_at_both_ends() -> None:
    parse_request({**COMPLETION, "logprobs": 0}, "completion", CTX)
    parse_request({**COMPLETION, "logprobs": 5}, "completion", CTX)
    for bad in (-1, 6):
        with pytest.raises(APIError):
            parse_request({**COMPLETION, "logprobs": bad}, "completion", CTX)
    parse_request({**CHAT, "logprobs": True, "top_logprobs": 0}, "chat", CTX)
    parse_request({**CHAT, "logprobs": True, "top_logprobs": 20}, "chat", CTX)
    for bad in (-1, 21):
        with pytest.raises(APIError) as err:
            parse_request({**CHAT, "logprobs": True, "top_logprobs": bad}, "chat", CTX)
        assert err.value.param == "top_logprobs"


def test_negative_seed_is_taken() -> None:
    assert parse_request({**CHAT, "seed": -1}, "chat", CTX).params.seed == -1


@pytest.mark.parametrize("body,kind,param", [
    ({**CHAT, "messages": [{"role": "user", "content": "a\ud800b"}]}, "chat", "messages[0].content"),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]}, "chat",
     "messages[0].content[0].text"),
    ({**COMPLETION, "prompt": "\ud800"}, "completion", "prompt"),
    ({**CHAT, "stop": ["ok", "\ud800"]}, "chat", "stop[1]"),
    ({**CHAT, "model": "\ud800"}, "chat", "model"),
    ({**CHAT, "user": {"\ud800": 1}}, "chat", "user"),
])
def test_lone_surrogates_are_a_400(body: dict, kind: str, param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_request(body, kind, CTX)
    assert err.value.status == 400 and err.value.param == param and "surrogate" in err.value.message


@pytest.mark.parametrize("field,value", [("ignore_eos", "yes"), ("stream", 1),
                                         ("stream_options", {"include_usage": "true"})])
def test_booleans_must_be_booleans(field: str, value: object) -> None:
    with pytest.raises(APIError) as err:
        parse_request({**CHAT, field: value}, "chat", CTX)
    assert err.value.status == 400


@pytest.mark.parametrize("kind,body", [("chat", CHAT), ("completion", COMPLETION)])
@pytest.mark.parametrize("field,value", [("foo", 1), ("reasoning_effort", "low"), ("prediction", {}),
                                         ("service_tier", "auto")])
def test_unknown_fields_are_a_400_that_names_them(kind: str, body: dict, field: str, value: object) -> None:
    """No silently ignored input: a field the server does not implement is a 400 that names it."""
    with pytest.raises(APIError) as err:
        parse_request({**body, field: value}, kind, CTX)
    assert err.value.status == 400 and err.value.param == field and err.value.code == "unknown_parameter"


@pytest.mark.parametrize("field", ["user", "metadata", "store"])
def test_openai_metadata_fields_are_accepted(field: str) -> None:
    parse_request({**CHAT, field: {"a": "b"} if field == "metadata" else ("u1" if field == "user" else True)},
                  "chat", CTX)


@pytest.mark.parametrize("body,kind,param", [
    ({**COMPLETION, "best_of": 2}, "completion", "best_of"),
    ({**COMPLETION, "suffix": "end"}, "completion", "suffix"),
    ({**CHAT, "functions": [{"name": "f"}]}, "chat", "functions"),
    ({**CHAT, "function_call": "auto"}, "chat", "function_call"),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "chat", "messages[0].content[0]"),
])
def test_unsupported_values_are_refused_by_name(body: dict, kind: str, param: str) -> None:
    with pytest.raises(APIError) as err:
        parse_request(body, kind, CTX)
    assert err.value.status == 400 and err.value.param == param and err.value.code == "unsupported"


@pytest.mark.parametrize("bias,ok", [({"42": 100}, True), ({"42": -100}, True), ({"42": 100.5}, False),
                                     ({"x": 1}, False), ({"42": "1"}, False), ([1], False)])
def test_logit_bias_bounds(bias: object, ok: bool) -> None:
    if ok:
        assert parse_request({**CHAT, "logit_bias": bias}, "chat", CTX).params.logit_bias == ((42, bias["42"]),)
        return
    with pytest.raises(APIError) as err:
        parse_request({**CHAT, "logit_bias": bias}, "chat", CTX)
    assert err.value.param == "logit_bias"


def test_the_developer_role_is_a_system_message() -> None:
    req = parse_request({**CHAT, "messages": [{"role": "developer", "content": "Be brief."},
                                              {"role": "user", "content": "hi"}]}, "chat", CTX)
    assert req.messages[0] == {"role": "system", "content": "Be brief."}
