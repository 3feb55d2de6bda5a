"""The newcomer path: the README's `make serve` on a fresh machine needs nothing but the base install.

One test, one install: `scripts/bootstrap.sh base` builds a fresh environment (what `make serve` runs
first), torch must be absent from it, and from it `crucible serve` answers the README's question with
Paris through the openai client; `crucible models`, `generate` and `batch` work there too. The
tokenizer of the embedded GGUF is converted afresh in it (the cache is keyed by the file's path).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import openai
import pytest

from crucible.core.proc import child_env
from serve.launch import start_server, stop_server

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France?"


PROBE_TEXTS = [QUESTION, "  spaces\tand\nnewlines", "émoji 🙂 ünïcödé", "<|im_start|>user\nhi<|im_end|>", "12345 + 0.5"]
PROBE_CHATS = [[{"role": "user", "content": QUESTION}],
               [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
                {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]]


def _reference_ids() -> list[list[int]]:
    from transformers import AutoTokenizer

    from crucible.core.registry import resolve_model
    from crucible.core.tokenizer import chat_prompt_ids

    path = resolve_model("smollm2-135m").path
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)  # transformers' path, with torch
    return [tok(x, add_special_tokens=False)["input_ids"] for x in PROBE_TEXTS] + [
        chat_prompt_ids(tok, c) for c in PROBE_CHATS]


@pytest.mark.slow
def test_a_base_environment_serves_generates_and_batches(tmp_path: Path) -> None:
    venv = tmp_path / "base-venv"
    # A fresh machine: nothing of this process's interpreter setup reaches the install or the checks.
    env = {k: v for k, v in child_env({"CRUCIBLE_VENV": str(venv)}).items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    start = time.perf_counter()
    boot = subprocess.run(["bash", "scripts/bootstrap.sh", "base"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert boot.returncode == 0, boot.stdout[-2000:] + boot.stderr[-4000:]
    print(f"base install: {time.perf_counter() - start:.0f} s")
    py = str(venv / "bin" / "python")
    # -I: the environment's own packages only (no PYTHON* variables, user site or working directory).
    no_torch = subprocess.run([py, "-I", "-c", "import torch"], capture_output=True, text=True, cwd=tmp_path)
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr

    # The torch-free tokenizer equals transformers' own GGUF tokenizer (built here, where torch is).
    probe = ("import json; from crucible.core.registry import resolve_model; "
             "from crucible.core.tokenizer import chat_prompt_ids, gguf_tokenizer; "
             "t = gguf_tokenizer(resolve_model('smollm2-135m').path); "
             f"print(json.dumps([t(x, add_special_tokens=False)['input_ids'] for x in {PROBE_TEXTS!r}] + "
             f"[chat_prompt_ids(t, c) for c in {PROBE_CHATS!r}]))")
    base_ids = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=child_env(), timeout=300)
    assert base_ids.returncode == 0, base_ids.stderr[-3000:]
    assert json.loads(base_ids.stdout.strip().splitlines()[-1]) == _reference_ids()

    crucible = [py, "-m", "crucible.cli"]
    models = subprocess.run([*crucible, "models"], capture_output=True, text=True, env=child_env(), timeout=120)
    assert models.returncode == 0 and str(venv) in models.stdout, models.stdout + models.stderr

    server = start_server("smollm2-135m", python=py)
    try:
        client = openai.OpenAI(base_url=server.v1, api_key="none", max_retries=0, timeout=300)
        answer = client.chat.completions.create(model="smollm2-135m", temperature=0, max_tokens=32,
                                                messages=[{"role": "user", "content": QUESTION}])
        assert "Paris" in answer.choices[0].message.content
    finally:
        stop_server(server)

    gen = subprocess.run([*crucible, "generate", QUESTION, "--max-tokens", "32"], capture_output=True, text=True,
                         env=child_env(), timeout=900)
    assert gen.returncode == 0 and "Paris" in gen.stdout, gen.stdout + gen.stderr[-3000:]
    # The engine's greedy text is the server's: the same tokenizer, template and kernels.
    assert gen.stdout.strip() == answer.choices[0].message.content.strip()

    rows, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows.write_text(json.dumps({"id": "q", "prompt": QUESTION, "temperature": 0, "max_tokens": 32}) + "\n")
    batch = subprocess.run([*crucible, "batch", str(rows), str(out)], capture_output=True, text=True,
                           env=child_env(), timeout=900)
    assert batch.returncode == 0, batch.stderr[-3000:]
    assert json.loads(out.read_text())["text"] == answer.choices[0].message.content
