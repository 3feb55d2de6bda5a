"""Sliding-window attention of Mistral and Qwen2 config.json files, as transformers reads them.

Mistral's every layer attends to the last `sliding_window` keys (4096 when the key is absent, as in
Mistral 7B v0.1); Qwen2 and Qwen3 do so with `use_sliding_window`, from `max_window_layers` on. The
models run through the attention ops' `window`, as Gemma 3's sliding layers do; before, Mistral's
window was silently ignored.

Bound as in test_parity_tiny.py: 1e-4 + 2e-6 * max|logit|. The control: the same weights without a
window (transformers on a windowless twin folder) must be far from ours, so the 50-token prompt does
reach past the 9-token window.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from crucible.reference import Reference
from graphs.config import config_from_hf
from graphs.generate import full_logits, incremental_logits
from graphs.model import CrucibleModel
from tests.support.tiny_models import TINY_LLAMA, TINY_QWEN2, write_hf

WINDOW = 9
SPECS = {"mistral": dataclasses.replace(TINY_LLAMA, sliding_window=WINDOW),
         "qwen2": dataclasses.replace(TINY_QWEN2, sliding_window=WINDOW)}


def _bound(reference_logits: np.ndarray) -> float:
    return 1e-4 + 2e-6 * float(np.abs(reference_logits).max())


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sliding")
    out = {}
    for name, spec in SPECS.items():
        out[name] = write_hf(spec, root / name)
        out[name + "-global"] = write_hf(dataclasses.replace(spec, sliding_window=0), root / (name + "-global"))
    return out


@pytest.mark.parametrize("name", sorted(SPECS))
def test_sliding_window_matches_transformers(folders: dict[str, Path], name: str) -> None:
    model = CrucibleModel(str(folders[name]))
    cfg = model.config
    assert cfg.sliding_window == WINDOW
    assert cfg.sliding_layers == ((True, True) if name == "mistral" else (False, True))
    ids = np.random.default_rng(11).integers(3, SPECS[name].vocab_size, 50).tolist()
    ours, theirs = full_logits(model, ids), Reference(folders[name]).logits(ids)
    assert np.abs(ours - theirs).max() <= _bound(theirs)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    # Decode steps read the paged cache through the same window.
    steps = incremental_logits(model, ids, 30)
    assert np.abs(steps - theirs[29:]).max() <= _bound(theirs)
    # Control: without the window the logits are far from ours.
    windowless = Reference(folders[name + "-global"]).logits(ids)
    assert np.abs(ours - windowless).max() > 100 * _bound(theirs)


def _config(tmp_path: Path, **fields: object) -> Path:
    raw = {"vocab_size": 10, "hidden_size": 128, "intermediate_size": 128, "num_hidden_layers": 4,
           "num_attention_heads": 2, **fields}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def test_window_keys_read_as_transformers_reads_them(tmp_path: Path) -> None:
    mistral = {"architectures": ["MistralForCausalLM"]}
    assert config_from_hf(_config(tmp_path, **mistral)).sliding_window == 4096  # v0.1 writes no key
    assert config_from_hf(_config(tmp_path, **mistral, sliding_window=None)).sliding_window == 0  # v0.2+
    qwen = {"architectures": ["Qwen2ForCausalLM"], "sliding_window": 32768, "max_window_layers": 2}
    assert config_from_hf(_config(tmp_path, **qwen, use_sliding_window=False)).sliding_window == 0
    cfg = config_from_hf(_config(tmp_path, **qwen, use_sliding_window=True))
    assert (cfg.sliding_window, cfg.sliding_layers) == (32768, (False, False, True, True))
    cfg = config_from_hf(_config(tmp_path, **qwen, use_sliding_window=True,
                                 layer_types=["sliding_attention", "full_attention"] * 2))
    assert cfg.sliding_layers == (True, False, True, False)
    assert config_from_hf(_config(tmp_path, architectures=["LlamaForCausalLM"], sliding_window=8)).sliding_window == 0
