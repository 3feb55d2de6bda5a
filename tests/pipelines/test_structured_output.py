"""Structured output and tool calls on the tiny random-weight model: whatever the model prefers, the
grammar makes the output parse and validate against the schema (the 135M model's behaviour is checked
in tests/serve/test_smollm2_server.py). Without a grammar the same model writes no JSON at all: the
control that shows the constraint is what does it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pipelines.generator import Generator
from pipelines.grammar import Grammar, GrammarCompiler, GrammarError
from pipelines.openai_request import RequestError
from pipelines.sampling import SamplingParams
from tests.support.openai_fixtures import TOOLS

# Bounded values (enums, small integers, short strings) so that a random model completes the document
# well within max_tokens; a real model is tested with free-form strings.
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "population": {"type": "integer", "minimum": 0, "maximum": 999},
        "capital": {"type": "boolean"},
        "kind": {"enum": ["town", "city"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["city", "population", "capital", "kind", "tags"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture
def gen(make_engine) -> Generator:
    return Generator(engine=make_engine(max_batch_size=8))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_validates(gen: Generator, temperature: float) -> None:
    results = gen.create(messages=CHAT, max_tokens=200, temperature=temperature, seed=3, n=4,
                         response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA,
                                                                                 "strict": True}})
    for r in results:
        assert r.finish_reason == "stop", r.text
        jsonschema.validate(json.loads(r.text), SCHEMA)
    assert gen.engine.kv_pages_in_use() == 0


def test_json_object_output_is_an_object(gen: Generator) -> None:
    [r] = gen.create(messages=CHAT, max_tokens=120, temperature=0.7, seed=1, response_format={"type": "json_object"})
    if r.finish_reason == "stop":  # an open-ended object may run to max_tokens; what is there is a prefix
        assert isinstance(json.loads(r.text), dict)
    assert r.text.startswith("{")


def test_control_without_a_grammar_the_model_writes_no_json(gen: Generator) -> None:
    [r] = gen.create(messages=CHAT, max_tokens=40, temperature=0)
    with pytest.raises(ValueError):
        jsonschema.validate(json.loads(r.text), SCHEMA)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "weather"}}])
@pytest.mark.parametrize("parallel", [True, False])
def test_forced_tool_calls_follow_the_parameter_schema(gen: Generator, choice, parallel: bool) -> None:
    results = gen.create(messages=CHAT, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                         max_tokens=160, temperature=0.8, seed=5, n=3)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for r in results:
        assert r.tool_calls and r.finish_reason in ("tool_calls", "length"), r.text
        if not parallel:
            assert len(r.tool_calls) == 1
        for call in r.tool_calls:
            assert call["type"] == "function" and call["id"].startswith("call_")
            name = call["function"]["name"]
            if isinstance(choice, dict):
                assert name == "weather"
            jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[name])


def test_tool_choice_none_and_auto_leave_the_text_free(gen: Generator) -> None:
    [none] = gen.create(messages=CHAT, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0)
    [plain] = gen.create(messages=CHAT, max_tokens=12, temperature=0)
    assert none.text == plain.text and not none.tool_calls  # "none": the tools are not even in the prompt
    [auto] = gen.create(messages=CHAT, tools=TOOLS, max_tokens=12, temperature=0)
    assert auto.finish_reason in ("stop", "length")


def test_a_multi_turn_tool_conversation_is_accepted(gen: Generator) -> None:
    turns = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    [r] = gen.create(messages=turns, tools=TOOLS, max_tokens=8, temperature=0)
    assert r.finish_reason in ("stop", "length", "tool_calls")
    prompt = gen.tokenizer.decode(gen.encode(turns))
    assert "<tool_response>\n5\n</tool_response>" in prompt and '"name": "add"' in prompt


@pytest.mark.parametrize("schema,feature", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "if"),
    ({"type": "string", "format": "not-a-format"}, "not-a-format"),
])
def test_an_unsupported_schema_feature_is_named(gen: Generator, schema: dict, feature: str) -> None:
    with pytest.raises(GrammarError, match=feature):
        gen.create(messages=CHAT, response_format={"type": "json_schema", "json_schema": {"name": "x",
                                                                                            "schema": schema}})
    assert gen.engine.kv_pages_in_use() == 0 and not gen.engine.has_work


def test_request_checks_are_the_same_in_the_python_api(gen: Generator) -> None:
    with pytest.raises(RequestError) as err:
        gen.create(messages=CHAT, frequency_penalty=3)
    assert err.value.param == "frequency_penalty"
    with pytest.raises(RequestError) as err:
        gen.create(messages=CHAT, tool_choice="required")
    assert err.value.param == "tool_choice"


def test_the_mask_allows_exactly_the_grammar(tiny_tokenizer, tiny_model) -> None:
    """Walk a valid document: every token is allowed when it comes, then only the end token is."""
    eos = tuple(tiny_model.config.eos_token_ids)
    compiler = GrammarCompiler(tiny_tokenizer, tiny_model.config.vocab_size, eos)
    matcher = compiler.matcher(Grammar.json_schema(SCHEMA))
    doc = json.dumps({"city": "Oslo", "population": 7, "capital": True, "kind": "city", "tags": ["a"]})
    for tok in tiny_tokenizer.encode(doc, add_special_tokens=False):
        assert matcher.allowed()[tok]
        matcher.accept(tok)
    assert matcher.done and set(matcher.allowed().nonzero()[0]) <= set(eos)
    bad = compiler.matcher(Grammar.json_schema(SCHEMA))
    with pytest.raises(RuntimeError, match="grammar"):
        bad.accept(tiny_tokenizer.encode("[", add_special_tokens=False)[0])


def test_sampling_params_take_a_grammar_directly(gen: Generator) -> None:
    [r] = gen.generate(["hi"], SamplingParams(temperature=0, max_tokens=100,
                                              grammar=Grammar.json_schema({"enum": ["yes", "no"]})))
    assert json.loads(r.text) in ("yes", "no")


# A Qwen2.5-style template that renders tools, assistant tool_calls and tool results itself.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments.a }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_that_takes_tools_renders_them_itself(tiny_tokenizer) -> None:
    import copy

    from pipelines.openai_request import encode_request, parse_request

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TOOLS_TEMPLATE
    turns = CHAT + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    req = parse_request({"messages": turns, "tools": TOOLS}, "chat", 1024, require_model=False)
    text = tok.decode(encode_request(tok, req)[0])
    # the template's own rendering: tool names listed, arguments as a mapping, the tool role kept
    assert "TOOLS: add weather" in text and "<tool_call>add 2</tool_call>" in text
    assert "<|im_start|>tool\n5" in text and "<tool_response>" not in text


def test_tool_call_tags_that_are_special_tokens_stay_in_the_text(tiny_model, tiny_tokenizer) -> None:
    """Hermes-style tokenizers make <tool_call> a special token; decoding must keep it (and still drop
    the other special tokens), or no call could be read from the text."""
    import copy

    from pipelines.engine import EngineConfig, LLMEngine

    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    engine = LLMEngine(EngineConfig(model=str(tiny_model.source.path), max_batch_size=2), model=tiny_model,
                       tokenizer=tok)
    vocab = tok.get_vocab()
    ids = [vocab["<tool_call>"], *tok.encode("{}", add_special_tokens=False), vocab["</tool_call>"],
           *tiny_model.config.eos_token_ids]
    assert engine._decode(ids) == "<tool_call>{}</tool_call>"
    plain = LLMEngine(EngineConfig(model=str(tiny_model.source.path), max_batch_size=2), model=tiny_model,
                      tokenizer=tiny_tokenizer)
    assert not plain._kept_special  # the usual path: skip_special_tokens


def _strict(tools: list[dict], *names: str) -> list[dict]:
    return [{**t, "function": {**t["function"], "strict": True}} if t["function"]["name"] in names else t
            for t in tools]


def _walk(compiler: GrammarCompiler, grammar: Grammar, tok, text: str):
    """A matcher after `text`, each token checked against the mask before it is accepted (a token the
    grammar bans raises AssertionError)."""
    matcher = compiler.matcher(grammar)
    for t in tok.encode(text, add_special_tokens=False):
        assert matcher.allowed()[t], f"token {t} ({tok.decode([t])!r}) banned after {text!r}"
        matcher.accept(t)
    return matcher


@pytest.mark.parametrize("parallel", [True, False])
def test_strict_tools_under_auto_hold_the_call_and_leave_the_text_free(tiny_tokenizer, tiny_model,
                                                                      parallel: bool) -> None:
    from pipelines.tools import tools_grammar

    eos = tuple(tiny_model.config.eos_token_ids)
    compiler = GrammarCompiler(tiny_tokenizer, tiny_model.config.vocab_size, eos)
    grammar = tools_grammar(_strict(TOOLS, "add"), "auto", parallel)
    assert tools_grammar(TOOLS, "auto", parallel) is None  # no strict tool: the text is read as written
    free = _walk(compiler, grammar, tiny_tokenizer, "Sure, 2 + 3 is 5.\nAnything else?")
    assert any(free.allowed()[list(eos)])  # plain text may end here
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    done = _walk(compiler, grammar, tiny_tokenizer, "Let me add.\n" + call)
    assert any(done.allowed()[list(eos)])
    # weather is not strict: any JSON object passes as its arguments; add is strict: b must be 0-9
    _walk(compiler, grammar, tiny_tokenizer, '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}')
    with pytest.raises(AssertionError, match="banned"):
        _walk(compiler, grammar, tiny_tokenizer, '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 12')
    with pytest.raises(AssertionError, match="banned"):  # an unknown function
        _walk(compiler, grammar, tiny_tokenizer, '<tool_call>\n{"name": "delete_everything"')
    with pytest.raises(AssertionError, match="banned"):  # text after the tag is not a call
        _walk(compiler, grammar, tiny_tokenizer, "ok <tool_call> maybe later")
    second = call + "\n" + call
    if parallel:
        _walk(compiler, grammar, tiny_tokenizer, second)
    else:
        with pytest.raises(AssertionError, match="banned"):
            _walk(compiler, grammar, tiny_tokenizer, second)


def test_control_the_free_text_grammar_alone_lets_a_bad_call_through(tiny_tokenizer, tiny_model) -> None:
    # The same walk under a grammar of free text only: the bad arguments pass, so it is the call rule
    # of the auto grammar that bans them above.
    compiler = GrammarCompiler(tiny_tokenizer, tiny_model.config.vocab_size, tuple(tiny_model.config.eos_token_ids))
    _walk(compiler, Grammar("lark", "start: /(.|\\n)*/"), tiny_tokenizer,
          '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 12')


def test_auto_with_response_format_answers_in_the_format_or_calls_a_tool(gen: Generator, tiny_tokenizer,
                                                                          tiny_model) -> None:
    from pipelines.tools import tools_grammar

    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
    # Both tools strict and one call at most: a random model's free-form arguments, or call after call,
    # would run on to max_tokens.
    results = gen.create(messages=CHAT, tools=_strict(TOOLS, "add", "weather"), response_format=fmt,
                         parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=4, n=4)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for r in results:
        assert r.finish_reason in ("stop", "tool_calls"), r.text
        if r.tool_calls:
            assert r.finish_reason == "tool_calls" and len(r.tool_calls) == 1
            for call in r.tool_calls:
                jsonschema.validate(json.loads(call["function"]["arguments"]), schemas[call["function"]["name"]])
        else:
            jsonschema.validate(json.loads(r.text), SCHEMA)
    # Both branches are open at the start: the answer's "{" and the call's "<tool_call>".
    compiler = GrammarCompiler(tiny_tokenizer, tiny_model.config.vocab_size, tuple(tiny_model.config.eos_token_ids))
    grammar = tools_grammar(TOOLS, "auto", True, Grammar.json_schema(SCHEMA))
    _walk(compiler, grammar, tiny_tokenizer, json.dumps({"city": "Oslo", "population": 7, "capital": True,
                                                         "kind": "city", "tags": []}))
    _walk(compiler, grammar, tiny_tokenizer, '<tool_call>\n{"name": "weather", "arguments": {"unit": "C"}}')
    with pytest.raises(AssertionError, match="banned"):
        _walk(compiler, grammar, tiny_tokenizer, "Hello")


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_tags_that_are_special_tokens_are_named_as_tokens_in_the_grammar(tiny_tokenizer, tiny_model, choice) -> None:
    # Hermes-style tokenizers make <tool_call> one special token, which no text in a grammar matches:
    # the grammar must name it, or the model could not write its own tag (the control).
    import copy

    from pipelines.tools import special_tag_ids, tools_grammar

    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    special = special_tag_ids(tok)
    assert set(special) == {"<tool_call>", "</tool_call>"} and not special_tag_ids(tiny_tokenizer)
    compiler = GrammarCompiler(tok, len(tok), tuple(tiny_model.config.eos_token_ids))
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert special["<tool_call>"] in tok.encode(call, add_special_tokens=False)
    text = ("Let me add.\n" if choice == "auto" else "") + call
    done = _walk(compiler, tools_grammar(_strict(TOOLS, "add"), choice, False, special=special), tok, text)
    assert any(done.allowed()[list(tiny_model.config.eos_token_ids)])
    # Unnamed, the tag is banned by the mask, or (a forced literal) let through by the mask and refused
    # when accepted, which failed the request.
    with pytest.raises((AssertionError, RuntimeError), match="banned|grammar"):
        _walk(compiler, tools_grammar(_strict(TOOLS, "add"), choice, False), tok, text)
    if choice == "auto":
        with pytest.raises(AssertionError, match="banned"):
            _walk(compiler, tools_grammar(_strict(TOOLS, "add"), choice, False, special=special), tok,
                  '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 12')
    # Requests on this tokenizer get the grammar that names the tokens (every path goes through prompt_jobs).
    from pipelines.openai_request import parse_request, prompt_jobs

    req = parse_request({"messages": CHAT, "tools": _strict(TOOLS, "add"), "tool_choice": choice}, "chat", 1024,
                        require_model=False)
    [(_, params)] = prompt_jobs(tok, req, 1024)
    assert f"<[{special['<tool_call>']}]>" in params.grammar.text
    assert "<[" not in prompt_jobs(tiny_tokenizer, req, 1024)[0][1].grammar.text
