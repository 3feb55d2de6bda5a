"""Asking for a GPU where MAX sees none is a one-line error with exit status 2, not a driver traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible import cli


@pytest.mark.parametrize("argv", [
    ["bench", "kernels", "--target", "gpu", "--quick"],
    ["qualify", "--target", "gpu"],
    ["generate", "--device", "gpu", "hello"],
    ["serve", "--devices", "gpu"],
    ["batch", "in.jsonl", "out.jsonl", "--device", "gpu"],
])
def test_gpu_without_accelerator_is_a_clear_error(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "gpu_count", lambda: 0)
    for name in [n for n in dir(cli) if n.startswith("cmd_")]:  # no job may start
        monkeypatch.setattr(cli, name, lambda args, name=name: pytest.fail(f"{name} ran"))
    out_dir = tmp_path / "out"
    if "--out" not in argv and argv[0] in ("bench", "qualify"):
        argv = argv + ["--out", str(out_dir)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "no accelerator" in err and "cpu target" in err
    assert not out_dir.exists()  # nothing was started, nothing written


def test_cpu_runs_never_probe_for_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def probe() -> int:
        raise AssertionError("a CPU run must not probe for accelerators")

    monkeypatch.setattr(cli, "gpu_count", probe)
    parser = cli.build_parser()
    for argv in (["bench", "kernels"], ["qualify"], ["generate"], ["serve"], ["batch", "a", "b"], ["models"]):
        assert not cli.wants_gpu(parser.parse_args(argv))
    assert cli.main(["models"]) == 0


def test_opening_a_gpu_device_without_one_is_the_same_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from crucible.core import devices

    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    with pytest.raises(devices.NoGPUError, match="no accelerator"):
        devices.max_device("gpu")
    with pytest.raises(ValueError, match="'cpu' or 'gpu'"):
        devices.max_device("tpu")
    assert type(devices.max_device("cpu")).__name__ == "CPU"
