"""lm-eval-harness itself, through its `local-completions` model, against a real server process: a
multiple-choice task (loglikelihood requests: token-id prompts, echo, logprobs) and a generate_until
task, both on a six-row local data set (no hub). Every loglikelihood lm-eval computes from our
responses equals the one the model's own logits give."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.openai_fixtures import reference_logprobs

pytest.importorskip("lm_eval")  # in the test extra; a base install has no harness

ROWS = [{"question": f"Q{i}: what comes after {i}?", "choices": [f" {i + 1}", f" {i + 2}", " no"], "answer": 0}
        for i in range(6)]
TASKS = {
    "crucible_tiny_mc": "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\n"
                        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\nmetric_list:\n  - metric: acc\n",
    "crucible_tiny_gen": "output_type: generate_until\ndoc_to_text: \"{{question}}\"\n"
                         "doc_to_target: \"{{choices[0]}}\"\ngeneration_kwargs:\n  until: [\"\\n\"]\n"
                         "  max_gen_toks: 8\nmetric_list:\n  - metric: exact_match\n",
}


def _tasks(root: Path) -> Path:
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    folder = root / "tasks"
    folder.mkdir()
    for name, body in TASKS.items():
        (folder / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                                             f"    test: {data}\ntest_split: test\n{body}")
    return folder


def test_lm_eval_local_completions_runs_and_its_loglikelihoods_are_the_model_s(
        server, tiny_model, tiny_tokenizer, tmp_path: Path) -> None:
    """Runs lm-eval's own CLI in a child process, as users do (in this process, with MAX loaded, the
    harness's pyarrow JSON reader crashes), and reads its logged samples."""
    import openai

    tiny_tokenizer.save_pretrained(tmp_path / "tokenizer")
    model = openai.OpenAI(base_url=server.v1, api_key="unused").models.list().data[0].id
    out = tmp_path / "out"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": "unused"}
    run = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args",
         f"model={model},base_url={server.v1}/completions,tokenizer_backend=huggingface,"
         f"tokenizer={tmp_path / 'tokenizer'},num_concurrent=1,max_retries=1,tokenized_requests=True",
         "--tasks", ",".join(TASKS), "--include_path", str(_tasks(tmp_path)), "--log_samples",
         "--output_path", str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    samples = {name: [json.loads(line) for f in out.rglob(f"samples_{name}_*.jsonl")
                      for line in f.read_text().splitlines()] for name in TASKS}
    assert len(samples["crucible_tiny_mc"]) == 6 and len(samples["crucible_tiny_gen"]) == 6
    for sample in samples["crucible_tiny_mc"]:
        for args, resp in zip(sample["arguments"].values(), sample["resps"]):
            context, continuation = args["arg_0"], args["arg_1"]
            loglik = float(resp[0][0])
            ctx = tiny_tokenizer.encode(context, add_special_tokens=False)
            cont = tiny_tokenizer.encode(continuation, add_special_tokens=False)
            logp = reference_logprobs(tiny_model, ctx + cont)
            want = sum(logp[len(ctx) + j - 1, t] for j, t in enumerate(cont))
            assert loglik == pytest.approx(want, abs=1e-3)  # a few float32 logprobs summed
