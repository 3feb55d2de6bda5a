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


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("body,param,code", [
    # shapes that once reached the engine and came back as a 500
    ({**CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": "f"}}, "tool_choice", "invalid_value"),
    ({**CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": ["f"]}}}, "tool_choice",
     "invalid_value"),
    ({**CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": {"a": 1}}}}, "tool_choice",
     "invalid_value"),
    ({**CHAT, "logit_bias": {"²": 1}}, "logit_bias", "invalid_value"),
    ({**CHAT, "logit_bias": {"١٢": 5}}, "logit_bias", "invalid_value"),  # Arabic-Indic digits: not token 12
    ({**CHAT, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[" * 100000 + "]" * 100000}}]}]},
     "messages[1].tool_calls[0].function.arguments", "invalid_value"),
    # keys once accepted and ignored
    ({**CHAT, "response_format": {"type": "json_object", "foo": 1}}, "response_format.foo", "unknown_parameter"),
    ({**CHAT, "response_format": {"type": "text", "json_schema": {}}}, "response_format.json_schema",
     "unknown_parameter"),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {}, "x": 1}}},
     "response_format.json_schema.x", "unknown_parameter"),
    ({**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": "x"}}},
     "response_format.json_schema.schema", "invalid_type"),
    ({**CHAT, "tools": [{**TOOLS[0], "bogus": 1}]}, "tools[0].bogus", "unknown_parameter"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "bogus": 1}}]}, "tools[0].function.bogus",
     "unknown_parameter"),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {}}]}]},
     "messages[0].content[0].cache_control", "unknown_parameter"),
    ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
    ({**CHAT, "user": 5}, "user", "invalid_type"),
    ({**CHAT, "metadata": "x"}, "metadata", "invalid_type"),
    ({**CHAT, "store": "yes"}, "store", "invalid_type"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]},
     "tools[0].function.strict", "invalid_type"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]},
     "tools[0].function.strict", "invalid_type"),
])
def test_malformed_shapes_are_a_400_that_names_them(body: dict, param: str, code: str) -> None:
    with pytest.raises(APIError) as err:
        parse_request(body, "chat", CTX)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


def test_well_formed_shapes_beside_them_still_parse() -> None:
    """The controls: what OpenAI's SDKs send in these places is accepted."""
    named = {"type": "function", "function": {"name": "f"}}
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"},
                                               "strict": True}}]
    assert parse_request({**CHAT, "tools": tools, "tool_choice": named}, "chat", CTX).tool_choice == named
    parse_request({**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "t", "description": "d", "schema": {"type": "object"}, "strict": True}}}, "chat", CTX)
    parse_request({**CHAT, "stream": True, "stream_options": {"include_usage": True}}, "chat", CTX)
    parse_request({**CHAT, "stream": False, "stream_options": None, "user": "u", "store": False}, "chat", CTX)
    assert parse_request({**CHAT, "logit_bias": {"12": 5}}, "chat", CTX).params.logit_bias == ((12, 5.0),)
    part = {"type": "text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit"}}  # openai 3.x, LangChain
    parse_request({**CHAT, "messages": [{"role": "user", "content": [part]}]}, "chat", CTX)


def test_a_forced_call_cut_off_by_max_tokens_is_not_content() -> None:
    """tool_choice required (parallel calls allowed): a second call cut off by max_tokens was returned as
    content ("<" or '<tool_call>\\n{"name":'); the grammar allows only calls, so it is dropped. Under
    auto the model's text is its content (the control)."""
    from pipelines.openai_request import final_output

    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    for choice in ("required", {"type": "function", "function": {"name": "f"}}):
        req = parse_request({**CHAT, "tools": TOOLS, "tool_choice": choice}, "chat", CTX)
        for cut in ("<", '<tool_call>\n{"name":'):
            content, calls, reason = final_output(req, call + "\n" + cut, "length")
            assert (content, [c.name for c in calls], reason) == ("", ["f"], "length")
    auto = parse_request({**CHAT, "tools": TOOLS, "tool_choice": "auto"}, "chat", CTX)
    assert final_output(auto, "Sure. " + call, "stop")[0] == "Sure."
