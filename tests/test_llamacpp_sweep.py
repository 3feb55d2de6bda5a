"""The llama-server flag sweep's grid and how serve_compare picks its best setting (no server runs)."""

from __future__ import annotations

import dataclasses
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

    def row(flags: ServerFlags, level: int, tok_s: float) -> dict:
        return {"flags": dataclasses.asdict(flags), "level": level, "output_tok_s": tok_s, "errors": 0}

    no_cb, cb_off, cb_on = ServerFlags("off", 2, 2048, 512, False), ServerFlags("off", 2), ServerFlags("on", 2, 512, 128)
    rows = [row(no_cb, 1, 95.0), row(cb_off, 1, 90.0), row(cb_on, 1, 80.0), row(cb_off, 16, 120.0), row(cb_on, 16, 130.0)]
    path.write_text(json.dumps({"model": "m.gguf", "rows": rows}))
    assert best_flags(1, path) == no_cb
    assert best_flags(2, path) == cb_off  # nearest by ratio is 1 stream; its best measured batching row
    assert best_flags(4, path) == cb_on and best_flags(64, path) == cb_on  # nearest: 16 streams
    assert best_flags(1, path, model="other.gguf") is None
