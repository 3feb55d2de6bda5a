"""The device's model check, run here on the CPU in float32: references prepared with transformers,
saved the way they are carried to the GPU machine, then compared and served (benchmarks/device_models.py).

The saved reference keeps each position's logits at its top-64 and 2048 fixed random vocab ids; the
bound is model_parity's float32 one (1e-4 of max |logit|; the tiny models hold ~1e-6). Control: a
reference moved by 1% of max |logit| at one position must fail it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import device_models as D
from benchmarks import model_parity as P


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("device-models")
    D.prepare(folder, smollm2=False)
    return folder


def test_saved_reference_round_trips(prepared: Path) -> None:
    rows = P.load_reference(prepared / "tiny-llama.npz")
    assert len(rows) == len(P.PROMPTS)
    vocab = 397  # TINY_LLAMA's: smaller than SAMPLED_IDS, so every id is sampled
    for r in rows:
        positions = len(r.prompt_ids) + len(r.greedy)
        assert r.cols.shape == r.logits.shape == (positions, P.TOP_IDS + min(P.SAMPLED_IDS, vocab))
        assert r.cols.max() < vocab
        # the kept top ids hold each row's top-1 first
        assert (r.cols[:, 0] == r.top1).all() and r.max_abs >= np.abs(r.logits).max()


def test_models_match_and_serve_on_cpu(prepared: Path, tmp_path: Path) -> None:
    status = D.run(prepared, tmp_path, "cpu", ("float32",), {"float32": (1e-4, 1.0)})
    assert set(status) == {f"parity {m} float32" for m in json.loads((prepared / "manifest.json").read_text())["models"]} | {
        "serve tiny-llama"}
    assert all(s["ok"] for s in status.values()), {k: v.get("error") for k, v in status.items()}
    for name, s in status.items():
        if name.startswith("parity"):
            assert all(r["greedy_identical"] and r["ratio"] < 1e-5 for r in s["result"]["rows"]), name
    served = status["serve tiny-llama"]["result"]
    assert served["text"] == served["streamed_text"] and "dtype=float32" in served["kernels"]
    assert json.loads((tmp_path / "models.json").read_text()).keys() == status.keys()


def test_control_a_moved_reference_fails(prepared: Path) -> None:
    from graphs.model import CrucibleModel

    rows = P.load_reference(prepared / "tiny-llama.npz")
    moved = rows[0].logits.copy()
    moved[3, 5] += 0.01 * rows[0].max_abs
    model = CrucibleModel(str(prepared / "tiny-llama"))
    passed, out = P.compare(model, [replace(rows[0], logits=moved)], 1e-4, 1.0)
    assert not passed and out[0]["ratio"] >= 0.01 * 0.99


def test_a_reference_of_another_model_is_refused(prepared: Path) -> None:
    from graphs.model import CrucibleModel

    rows = P.load_reference(prepared / "tiny-qwen2-bf16.npz")  # vocab 411, against the Llama's 397
    model = CrucibleModel(str(prepared / "tiny-llama"))
    with pytest.raises(ValueError, match="another model"):
        P.compare(model, rows, 1e-4, 1.0)
