"""crucible.core.atomic_write: a result file is the old one or the whole new one, and no temporary is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.core.atomic_write import write_text_atomic


def test_writes_and_replaces_without_leaving_a_temporary(tmp_path: Path) -> None:
    path = tmp_path / "kernels.json"
    write_text_atomic(path, '{"rows": []}')
    write_text_atomic(path, '{"rows": [1]}')
    assert path.read_text() == '{"rows": [1]}'
    assert [p.name for p in tmp_path.iterdir()] == ["kernels.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kernels.json"
    path.write_text("old")

    def disk_full(self: Path, text: str) -> int:
        Path.write_bytes(self, text[:3].encode())  # a partial temporary, as a full disk would leave
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomic(path, "new content")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["kernels.json"]
