"""The llama-server flag sweep's grid and how serve_compare picks its best setting (no server runs)."""

from __future__ import annotations

import json

from benchmarks.llamacpp_sweep import ServerFlags, best_flags, settings


def test_grid_covers_every_flag_once() -> None:
    grid = settings(2)
    assert len(grid) == len(set(grid)) == 2 * 2 * 2 + 2
    assert {g.flash_attn for g in grid} == {"on", "off"} and {g.threads for g in grid} == {1, 2}
    assert {(g.batch, g.ubatch) for g in grid} == {(2048, 512), (512, 128)}
    assert any(not g.cont_batching for g in grid)
    assert ServerFlags("off", 2, 512, 128, False).args() == ["-fa", "off", "-t", "2", "-b", "512", "-ub", "128",
                                                             "--no-cont-batching"]


def test_best_flags_per_nearest_level(tmp_path) -> None:
    path = tmp_path / "server-sweep.json"
    assert best_flags(1, path) is None  # no sweep on this host: serve_compare keeps llama-server's defaults
    best = {"1": {"flags": {"flash_attn": "off", "threads": 2, "batch": 2048, "ubatch": 512, "cont_batching": False}},
            "16": {"flags": {"flash_attn": "on", "threads": 2, "batch": 512, "ubatch": 128, "cont_batching": True}}}
    path.write_text(json.dumps({"best": best}))
    assert best_flags(1, path) == ServerFlags("off", 2, 2048, 512, False)
    four = best_flags(4, path)
    assert four.flash_attn == "off" and four.cont_batching  # 1 stream's choice, but batching continuously
    assert best_flags(64, path).batch == 512
