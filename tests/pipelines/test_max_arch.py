"""Crucible's graph inside MAX's own pipeline: `max generate` and `max serve` with
``--custom-architectures pipelines.max_arch`` on the tiny Llama, against transformers' greedy answers.

MAX's tokenizer, chat template, scheduler, Jenga paged KV cache and sampler run; the decoder is ours
(its provenance line in MAX's log names our ops and no fallbacks).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from crucible.max_cli import max_generate, parse_generate_output, start_max_serve
from pipelines.max_arch.model import model_source

PROMPT = "What is the capital of France?"
SERVE_PROMPTS = ["Hello there.", "What is the capital of France?", "Count to five.",
                 "Write a haiku about rain.", "hi", "Tell me about the moon and the stars in the sky."]


def test_model_source_picks_gguf_or_folder(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert model_source(str(folder), []).format == "hf"
    gguf = model_source(str(folder), [Path("w.gguf")])  # relative paths are relative to the folder
    assert gguf.format == "gguf" and gguf.path == folder / "w.gguf"
    with pytest.raises(ValueError, match="one GGUF"):
        model_source(str(folder), [Path("a.gguf"), Path("b.gguf")])
    with pytest.raises(ValueError, match="--model-path"):
        model_source(str(tmp_path / "missing"), [])


def test_parse_generate_output() -> None:
    out = ("Paris.\nPrompt size: 21\nOutput size: 3\nStartup time: 1.0 ms\nTime to first token: 27.1 ms\n"
           "Prompt eval throughput (context-encoding): 773.85 tokens per second\nTime per Output Token: 6.4 ms\n"
           "Eval throughput (token-generation): 155.05 tokens per second\n")
    parsed = parse_generate_output(out)
    assert parsed["text"] == "Paris." and parsed["prompt_tokens"] == 21 and parsed["output_tokens"] == 3
    assert parsed["prefill_tok_s"] == pytest.approx(773.85) and parsed["decode_tok_s"] == pytest.approx(155.05)


def _same_text(text: str) -> str:
    # The tiny model's random weights emit partial UTF-8 sequences. MAX decodes incrementally (and
    # its server holds back a trailing partial character), transformers decodes the whole list, so
    # an invalid run becomes zero, one or several U+FFFD. Those are dropped; token counts are
    # compared exactly besides.
    return text.replace("\ufffd", "")


def _assert_ran_crucible(log: str, gguf: bool = False) -> None:
    line = next((ln for ln in log.splitlines() if "Crucible decoder from" in ln), None)
    assert line is not None, "MAX did not load Crucible's architecture"
    assert "'hot_path_fallbacks': []" in line
    # Over GGUF blocks the whole gated MLP runs as crucible.mlp.
    mlp = "mlp'" if gguf else "silu_mul'"
    for op in ("attention_paged", "qkv_rope_write", "add_rmsnorm", "rmsnorm'", mlp, "embedding"):
        assert f"crucible.{op}" in line


@pytest.mark.slow
@pytest.mark.parametrize("form", ["hf", "Q4_0"])
def test_max_generate_runs_our_graph(tiny_models, tiny_reference, form: str) -> None:
    files = tiny_models["llama"]
    weight = None if form == "hf" else files.gguf[form]
    result = max_generate(files.hf, PROMPT, 16, weight_path=weight)
    ref = tiny_reference("llama", form).greedy_chat([{"role": "user", "content": PROMPT}], 16)
    _assert_ran_crucible(result.log, gguf=weight is not None)
    assert result.prompt_tokens == len(ref.prompt_ids)
    assert result.output_tokens == len(ref.token_ids)
    assert _same_text(result.text) == _same_text(ref.text)


async def _chat(client: httpx.AsyncClient, url: str, model: str, prompt: str) -> tuple[str, int]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16,
            "temperature": 0}
    r = await client.post(url + "/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()
    return _same_text(out["choices"][0]["message"]["content"]), out["usage"]["completion_tokens"]


@pytest.mark.slow
def test_max_serve_batches_our_graph(tiny_models, tiny_reference, tmp_path: Path) -> None:
    files = tiny_models["llama"]
    ref = tiny_reference("llama", "hf")
    greedy = [ref.greedy_chat([{"role": "user", "content": p}], 16) for p in SERVE_PROMPTS]
    expected = [(_same_text(g.text), len(g.token_ids)) for g in greedy]
    server = start_max_serve(files.hf, tmp_path / "max-serve.log")
    try:
        async def run() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
            async with httpx.AsyncClient() as client:
                solo = [await _chat(client, server.v1, str(files.hf), p) for p in SERVE_PROMPTS]
                together = await asyncio.gather(*(_chat(client, server.v1, str(files.hf), p) for p in SERVE_PROMPTS))
            return solo, list(together)

        solo, together = asyncio.run(run())
    finally:
        server.stop()
    log = server.log()
    _assert_ran_crucible(log)
    # Our planner's CPU default (MAX's own is 1), so concurrent requests share steps.
    assert re.search(r"max_batch_size: 32\b", log)
    sizes = [int(n) for n in re.findall(r"Crucible decoder: largest batch so far (\d+) sequences", log)]
    assert max(sizes) > 1, "MAX's scheduler never put two requests into one step"
    assert solo == expected
    assert together == expected
